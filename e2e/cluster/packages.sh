#!/usr/bin/env bash
# Makes sure the host packages the tests need are installed: installs the missing ones as root on
# Debian/Ubuntu (apt-get), otherwise names them and exits 1. `make e2e-build` (so `make e2e`) runs it
# with the group e2e before it makes the virtual environment; CI (.ci/run) with e2e and unit, first of all.
#
#   packages.sh [GROUP...]    GROUP: e2e (default) or unit
#
# On Debian/Ubuntu dpkg-query says what is installed; elsewhere a probe per package looks for what the
# tests use (a command, a library's pkg-config entry) and the message names the Debian package.
set -euo pipefail

me=${0##*/}

# package | what needs it | probe where there is no dpkg-query
e2e_packages=(
    "python3-venv|the tests' virtual environment (Debian's python3 has no ensurepip without it)|python3 -c 'import ensurepip'"
    "gcc|runc (cgo)|command -v gcc"
    "pkg-config|runc: finds libseccomp|command -v pkg-config"
    "libseccomp-dev|runc with seccomp, which every pod's default profile needs|pkg-config --exists libseccomp"
    "ca-certificates|Go's module downloads over HTTPS (first build)|test -d /etc/ssl/certs"
    "make|the project's image (make base-image, make image)|command -v make"
    "openssl|the cluster's certificates|command -v openssl"
    "iproute2|the pod network's bridge (ip)|command -v ip"
    "nftables|kube-proxy's service network (nftables mode: the nft command)|command -v nft"
    "busybox-static|the test image (a static busybox)|static_busybox"
    "debootstrap|the project's base image, built offline|command -v debootstrap"
    "buildah|the project's image, built offline|command -v buildah"
)
unit_packages=(
    "podman|the unit suite's CDI tests (real containers)|command -v podman"
    "runc|the unit suite's CDI tests (podman's runtime)|command -v runc"
    "busybox-static|the unit suite's CDI tests (their image)|static_busybox"
)

static_busybox() { # a busybox on PATH that names no dynamic loader in its first page
    local path
    path=$(command -v busybox) || return 1
    ! head -c 4096 "$path" | grep -qa -e ld-linux -e ld-musl
}

debian() { command -v dpkg-query >/dev/null && command -v apt-get >/dev/null; }

installed() { # installed PACKAGE PROBE
    if debian; then
        local status
        status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null) || return 1
        [[ ${status:1:1} == i ]]
    else
        eval "$2" >/dev/null 2>&1
    fi
}

wanted=()
for group in "${@:-e2e}"; do
    case $group in
    e2e) wanted+=("${e2e_packages[@]}") ;;
    unit) wanted+=("${unit_packages[@]}") ;;
    *) echo "$me: unknown group $group (e2e, unit)" >&2; exit 2 ;;
    esac
done

missing_entries() { # the entries of wanted whose package is not installed, once each
    local entry package probe seen=" "
    for entry in "${wanted[@]}"; do
        IFS='|' read -r package _ probe <<<"$entry"
        [[ $seen == *" $package "* ]] && continue
        seen+="$package "
        installed "$package" "$probe" || printf '%s\n' "$entry"
    done
}

names_of() { # the package names of entries on stdin, one line
    local package names=()
    while IFS='|' read -r package _; do names+=("$package"); done
    echo "${names[*]}"
}

describe() { # the entries on stdin, one per line: package, what needs it
    local package purpose
    while IFS='|' read -r package purpose _; do printf '  %-16s %s\n' "$package" "$purpose"; done
}

missing=$(missing_entries)
[[ -z $missing ]] && exit 0
names=$(names_of <<<"$missing")

if ! debian; then
    {
        echo "$me: not a Debian/Ubuntu system (no dpkg-query and apt-get), and these are missing:"
        describe <<<"$missing"
        echo "Install their equivalents, then run this again (Debian names: $names)."
    } >&2
    exit 1
fi
if [[ $(id -u) != 0 ]]; then
    {
        echo "$me: these packages are not installed:"
        describe <<<"$missing"
        echo "Run as root (make e2e installs them then), or: sudo apt-get install $names"
    } >&2
    exit 1
fi

echo "$me: installing $names (apt-get)" >&2
read -r -a to_install <<<"$names"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2 || echo "$me: apt-get update failed; trying the package lists there are" >&2
apt-get install -y -qq "${to_install[@]}" >&2 || true
still=$(missing_entries)
if [[ -n $still ]]; then
    {
        echo "$me: apt-get could not install:"
        describe <<<"$still"
        echo "See apt-get's messages above."
    } >&2
    exit 1
fi
