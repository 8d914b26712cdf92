#!/usr/bin/env bash
# Builds the end-to-end cluster's components from their Go modules, at the versions of e2e/versions.env,
# into $IX_E2E_CACHE/<key>/ (default /var/cache/ix-device-plugin-e2e), so that a machine builds them once:
#
#   bin/      etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, kube-proxy,
#             containerd, containerd-shim-runc-v2, ctr, runc, helm, cdi-validate,
#             dra-metadata-check, pause, kueue
#   cni/bin/  bridge, host-local, loopback
#   kueue/    kueue-crds.yaml: the CustomResourceDefinitions of the Kueue release kueue runs
#   complete  written last: the harness only uses a folder that has it
#
# <key> is derived from versions.env, so a version change builds into a fresh folder; Go's module and
# build caches ($IX_E2E_CACHE/go/) are shared by all keys. Every binary is verified before it is used: it
# runs and reports the version versions.env pins, and runc reports libseccomp. A component whose binaries
# all pass is skipped; otherwise it is built into staging/<component>/, its new binaries are verified
# the same way and only then moved into place, so a binary that lacks what the suite needs (runc
# without seccomp) is refused, never cached, and a cache filled on a machine that lacked a package heals
# on the next build once the package is there. Needs Go (go on PATH or /usr/local/go/bin), gcc and
# libseccomp (runc; e2e/cluster/packages.sh installs the packages), network access to the Go module proxy
# on a cold build.
#
#   build.sh [LANE]              build what is missing or fails verification, print the folder
#   build.sh --print-dir [LANE]  print the folder only (exit 1 when it is not complete)
#   build.sh --verify [LANE]     verify the binaries in the folder, build nothing (exit 1 naming each bad one)
#
# LANE (default: $IX_E2E_LANE; none is the default lane) names e2e/lanes/LANE.env, KEY=value lines over
# versions.env: another Kubernetes or containerd, and CONTAINERD_NRI=on|off (containerd's configuration, which
# the harness writes; not a build input). A lane's folder is keyed by versions.env and its other lines, so a
# lane that pins nothing but CONTAINERD_NRI uses the default lane's folder, and lanes that pin the same versions
# share one. A component a lane pins as the default lane does is hard-linked from the default lane's folder,
# once its binaries pass verify there, instead of built again.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
e2e=$(dirname "$here")

die() {
    echo "build.sh: $*" >&2
    exit 1
}

mode=build
case ${1:-} in --print-dir | --verify) mode=$1 && shift ;; esac
(($# <= 1)) || die "usage: build.sh [--print-dir | --verify] [LANE]"
lane=${1:-${IX_E2E_LANE:-}}

# shellcheck source=../versions.env
source "$e2e/versions.env"
declare -A default_pins=() # versions.env's lines, for telling which components a lane pins as the default does
while IFS='=' read -r name value; do default_pins[$name]=$value; done < <(grep -E '^[A-Z0-9_]+=' "$e2e/versions.env")

cache_root=${IX_E2E_CACHE:-/var/cache/ix-device-plugin-e2e}
key=$(sha256sum "$e2e/versions.env" | cut -c1-16)
base=$cache_root/$key # the default lane's folder
if [[ -n $lane ]]; then
    lane_file=$e2e/lanes/$lane.env
    if [[ ! $lane =~ ^[a-z0-9][a-z0-9._-]*$ || ! -f $lane_file ]]; then
        die "no lane \"$lane\" (the lanes: $(cd "$e2e/lanes" && ls -- *.env | sed 's/\.env$//' | paste -sd " "))"
    fi
    # shellcheck source=/dev/null
    source "$lane_file"
    pins=$(grep -E '^[A-Z0-9_]+=' "$lane_file" | grep -v '^CONTAINERD_NRI=' | LC_ALL=C sort || true)
    [[ -z $pins ]] || key=$({ cat "$e2e/versions.env" && echo "$pins"; } | sha256sum | cut -c1-16)
fi
dest=$cache_root/$key
# containerd 2.x is the module github.com/containerd/containerd/v2, 1.x github.com/containerd/containerd; each
# names its module in `containerd --version` and `ctr --version`.
case $CONTAINERD_VERSION in
v1.*) containerd_module=github.com/containerd/containerd ;;
*) containerd_module=github.com/containerd/containerd/v2 ;;
esac

if [[ $mode == --print-dir ]]; then
    echo "$dest"
    [[ -f $dest/complete ]]
    exit
fi

# Each component: its name, the function that builds it and its binaries (relative to $dest), in build order.
components=(
    "tools build_tools bin/pause bin/cdi-validate bin/dra-metadata-check"
    "runc build_runc bin/runc"
    "containerd build_containerd bin/containerd bin/containerd-shim-runc-v2 bin/ctr"
    "cni-plugins build_cni cni/bin/bridge cni/bin/host-local cni/bin/loopback"
    "etcd build_etcd bin/etcd"
    "helm build_helm bin/helm"
    "kubernetes build_kubernetes bin/kube-apiserver bin/kube-controller-manager bin/kube-scheduler bin/kubelet bin/kubectl"
    "kube-proxy build_kube_proxy bin/kube-proxy"
    "kueue build_kueue bin/kueue kueue/kueue-crds.yaml"
)
# The lines of versions.env each component is built from (and BUILD_RECIPE, which all are).
declare -A component_pins=(
    [tools]=CDI_VERSION [runc]=RUNC_VERSION [containerd]=CONTAINERD_VERSION [cni-plugins]=CNI_PLUGINS_VERSION
    [etcd]=ETCD_VERSION [helm]=HELM_VERSION [kubernetes]="KUBERNETES_VERSION KUBERNETES_STAGING_VERSION"
    [kube-proxy]="KUBERNETES_VERSION KUBERNETES_STAGING_VERSION" [kueue]=KUEUE_VERSION
)

reports() { # reports FILE EXPECTED ARG...: `FILE ARG...` prints EXPECTED (whitespace-separated words, any
    # spacing); else prints what it said instead
    local file=$1 expected=$2 output status=0
    shift 2
    output=$(timeout 60 "$file" "$@" </dev/null 2>&1) || status=$?
    local flat
    flat=" $(tr -s '[:space:]' ' ' <<<"$output") "
    [[ $flat == *" $expected "* ]] && return 0
    local said=${output%%$'\n'*}
    echo "\`${file##*/}${*:+ $*}\` does not report \"$expected\" (exit $status${said:+, it says: $said})"
    return 1
}

contains() { # contains FILE TEXT ARG...: `FILE ARG...` prints TEXT somewhere (a log line, JSON); else prints what
    # it said instead
    local file=$1 text=$2 output status=0
    shift 2
    output=$(timeout 60 "$file" "$@" </dev/null 2>&1) || status=$?
    [[ $output == *"$text"* ]] && return 0
    local said=${output%%$'\n'*}
    echo "\`${file##*/}${*:+ $*}\` does not say '$text' (exit $status${said:+, it says: ${said:0:300}})"
    return 1
}

crds() { # crds FILE: FILE holds the CustomResourceDefinitions the Kueue manager needs; else prints what is missing
    local file=$1 kind
    for kind in workloads clusterqueues localqueues resourceflavors; do
        grep -q "^  name: $kind.kueue.x-k8s.io\$" "$file" || { echo "no CustomResourceDefinition $kind.kueue.x-k8s.io"; return 1; }
    done
}

verify() { # verify FILE: the binary at FILE runs and reports what versions.env pins; else prints why not
    local file=$1 name=${1##*/}
    [[ -f $file ]] || { echo "missing"; return 1; }
    [[ $name != kueue-crds.yaml ]] || { crds "$file"; return; }
    [[ -x $file ]] || { echo "not executable"; return 1; }
    case $name in
    runc)
        reports "$file" "runc version ${RUNC_VERSION#v}" --version || return 1
        reports "$file" "libseccomp:" --version >/dev/null && return 0
        echo "built without seccomp (\`runc --version\` names no libseccomp), which every pod's default" \
            "profile needs: install libseccomp-dev and pkg-config (e2e/cluster/packages.sh does as root)"
        return 1
        ;;
    containerd | ctr) reports "$file" "$containerd_module $CONTAINERD_VERSION" --version ;;
    containerd-shim-runc-v2) reports "$file" "Version: $CONTAINERD_VERSION" -v ;;
    bridge | host-local | loopback) reports "$file" "CNI $name plugin $CNI_PLUGINS_VERSION" ;;
    etcd) reports "$file" "etcd Version: ${ETCD_VERSION#v}" --version ;;
    helm) reports "$file" "$HELM_VERSION" version --template '{{.Version}}' ;;
    kubectl) reports "$file" "Client Version: $KUBERNETES_VERSION" version --client ;;
    kubelet | kube-*) reports "$file" "Kubernetes $KUBERNETES_VERSION" --version ;;
    cdi-validate) reports "$file" "usage: cdi-validate [--inject NAME[,NAME...]] SPEC_DIR..." ;;
    dra-metadata-check) reports "$file" "usage: dra-metadata-check FILE..." ;;
    # Kueue has no version flag: it logs its version as it starts, and exits where it finds no cluster (KUBECONFIG
    # names none, so that it never reaches one)
    kueue) KUBECONFIG=/nonexistent contains "$file" "\"gitVersion\":\"$KUEUE_VERSION\"" ;;
    pause) ;; # runs until signalled; built from this repository's tools, rebuilt when they change (tools.sum)
    *) die "no verification for $name" ;;
    esac
}

if [[ $mode == --verify ]]; then
    bad=0
    for entry in "${components[@]}"; do
        read -r -a fields <<<"$entry"
        for file in "${fields[@]:2}"; do
            why=$(verify "$dest/$file") && continue
            echo "build.sh: $dest/$file: $why" >&2
            bad=1
        done
    done
    exit "$bad"
fi

export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || die "Go is needed (https://go.dev/dl/)"
export GOMODCACHE=$cache_root/go/mod GOCACHE=$cache_root/go/build GOPATH=$cache_root/go/path
export GOFLAGS="-buildvcs=false -trimpath" GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
mkdir -p "$dest/bin" "$dest/cni/bin" "$dest/kueue" "$dest/src" 2>/dev/null ||
    die "cannot create $dest: run as root, or set IX_E2E_CACHE to a folder you can write"
exec 9>"$cache_root/.lock"
flock -w 3600 9 || die "another build has held $cache_root/.lock for an hour"
log=$dest/build.log

step() { # step NAME BUILDER FILE...: unless every FILE passes verify (and $rebuild is not NAME), BUILDER
    # builds them into $out; they replace the cached ones only once they pass verify there
    local name=$1 builder=$2 file why stale=0
    shift 2
    [[ ${rebuild:-} == "$name" ]] && stale=1
    for file in "$@"; do
        [[ -e $dest/$file ]] || { stale=1; continue; }
        why=$(verify "$dest/$file") && continue
        echo "build.sh: the cached $file is not usable, rebuilding $name: $why" >&2
        stale=1
    done
    ((stale)) || return 0
    link_from_default "$name" "$@" && return 0
    local start=$SECONDS
    echo "build.sh: $name ..." >&2
    out=$dest/staging/$name
    rm -rf "$out"
    mkdir -p "$out"
    ("$builder")
    for file in "$@"; do
        why=$(verify "$out/${file##*/}") && continue
        rm -rf "$out"
        die "$name: the $file just built is refused: $why"
    done
    for file in "$@"; do
        mv -f "$out/${file##*/}" "$dest/$file"
    done
    rm -rf "$out"
    rmdir "$dest/staging" 2>/dev/null || true
    echo "$name: $((SECONDS - start)) s" | tee -a "$log" >&2
}

link_from_default() { # link_from_default NAME FILE...: in a lane's folder, NAME's FILEs hard-linked (or copied)
    # from the default lane's folder, where the lane pins NAME as versions.env does and they pass verify there
    local name=$1 pin file
    shift
    [[ $dest != "$base" ]] || return 1
    for pin in BUILD_RECIPE ${component_pins[$name]}; do
        [[ ${!pin} == "${default_pins[$pin]:-}" ]] || return 1
    done
    [[ $name != tools || $(cat "$base/tools.sum" 2>/dev/null) == "$tools_sum" ]] || return 1
    for file in "$@"; do
        verify "$base/$file" >/dev/null || return 1
    done
    for file in "$@"; do
        ln -f "$base/$file" "$dest/$file" 2>/dev/null || cp -f "$base/$file" "$dest/$file"
        verify "$dest/$file" >/dev/null || return 1
    done
    echo "$name: linked from $base" | tee -a "$log" >&2
}

build_tools() { # pause (the sandbox image's process), cdi-validate and dra-metadata-check (the reference reader
    # of DRA device metadata, k8s.io/dynamic-resource-allocation), from e2e/cluster/tools
    rm -rf "$dest/src/tools"
    cp -r "$here/tools" "$dest/src/tools"
    cd "$dest/src/tools"
    go get "tags.cncf.io/container-device-interface@$CDI_VERSION"
    CGO_ENABLED=0 go build -o "$out/" ./pause ./cdi-validate ./dra-metadata-check
}

build_runc() { # with seccomp, which every pod's default profile needs: refused without libseccomp
    pkg-config --exists libseccomp 2>/dev/null ||
        die "runc needs libseccomp to build with seccomp: install libseccomp-dev and pkg-config" \
            "(e2e/cluster/packages.sh does as root; make e2e-build runs it)"
    GOBIN=$out CGO_ENABLED=1 go install -tags seccomp \
        -ldflags "-X main.version=${RUNC_VERSION#v}" "github.com/opencontainers/runc@$RUNC_VERSION"
}

build_containerd() {
    local m=$containerd_module
    if [[ $m == */v2 ]]; then
        GOBIN=$out CGO_ENABLED=0 go install -tags no_btrfs \
            -ldflags "-X $m/version.Version=$CONTAINERD_VERSION" \
            "$m/cmd/containerd@$CONTAINERD_VERSION" "$m/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
            "$m/cmd/ctr@$CONTAINERD_VERSION"
        return
    fi
    # containerd 1.x's go.mod has an exclude directive, for which `go install PKG@VERSION` refuses it: its commands
    # are built in a copy of the module, as the main module (its go.mod and go.sum as released)
    local module
    module=$(go mod download -json "$m@$CONTAINERD_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [[ -n $module ]] || die "containerd: no module folder for $m@$CONTAINERD_VERSION"
    rm -rf "$dest/src/containerd"
    cp -r "$module" "$dest/src/containerd"
    chmod -R u+w "$dest/src/containerd"
    cd "$dest/src/containerd"
    CGO_ENABLED=0 go build -tags no_btrfs -ldflags "-X $m/version.Version=$CONTAINERD_VERSION" -o "$out/" \
        ./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr
}

build_cni() { # with the version stamped in, as the project's release builds do ("CNI bridge plugin v1.10.0")
    local m=github.com/containernetworking/plugins/plugins
    local stamp=github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION
    GOBIN=$out CGO_ENABLED=0 go install -ldflags "-X $stamp" "$m/main/bridge@$CNI_PLUGINS_VERSION" \
        "$m/main/loopback@$CNI_PLUGINS_VERSION" "$m/ipam/host-local@$CNI_PLUGINS_VERSION"
}

build_helm() {
    GOBIN=$out CGO_ENABLED=0 go install -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
        "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
}

build_etcd() { # the etcd binary is go.etcd.io/etcd/server/v3/etcdmain behind a three-line main
    rm -rf "$dest/src/etcd"
    mkdir -p "$dest/src/etcd"
    cd "$dest/src/etcd"
    cat >main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    go mod init ix-e2e/etcd
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go mod tidy
    CGO_ENABLED=0 go build -o "$out/etcd" .
}

kubernetes_commands() { # kubernetes_commands DIR COMMAND...: k8s.io/kubernetes/cmd/COMMAND... into $out, from a
    # module made in DIR.
    # k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and
    # replaces them with ./staging/src/..., which is not in the module: a module that builds its commands
    # replaces each one with the release of the same minor version instead.
    local dir=$1
    shift
    rm -rf "$dir"
    mkdir -p "$dir"
    cd "$dir"
    go mod init ix-e2e/kubernetes
    go mod edit -require="k8s.io/kubernetes@$KUBERNETES_VERSION"
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
    local staging
    staging=$(sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod")
    local module
    for module in $staging; do
        if grep -qE "^\s+$module v0.0.0$" "$gomod"; then
            go mod edit -replace="$module=$module@$KUBERNETES_STAGING_VERSION"
        fi
    done
    local packages=()
    for module in "$@"; do packages+=("k8s.io/kubernetes/cmd/$module"); done
    # each at the pinned version: `go get PACKAGE` alone upgrades k8s.io/kubernetes to the newest release
    go get "${packages[@]/%/@$KUBERNETES_VERSION}"
    local minor=${KUBERNETES_VERSION#v1.}
    minor=${minor%%.*}
    local ldflags="" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    CGO_ENABLED=0 go build -ldflags "-s -w $ldflags" -o "$out/" "${packages[@]}"
}

build_kubernetes() {
    kubernetes_commands "$dest/src/kubernetes" kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
}

build_kube_proxy() { # the service network (the `kubernetes` Service for pods); its own module folder, so that a
    # cache built before it was added builds only kube-proxy (the packages it shares come from Go's build cache)
    kubernetes_commands "$dest/src/kube-proxy" kube-proxy
}

build_kueue() { # the manager, with the version stamped in as Kueue's release builds do, and the CRDs of its module
    # (config/components/crd/bases, without the conversion webhooks the release's kustomization adds: none runs here)
    local m=sigs.k8s.io/kueue
    GOBIN=$out CGO_ENABLED=0 go install -ldflags "-s -w -X $m/pkg/version.GitVersion=$KUEUE_VERSION" "$m/cmd/kueue@$KUEUE_VERSION"
    local module
    module=$(go mod download -json "$m@$KUEUE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [[ -n $module && -d $module/config/components/crd/bases ]] || die "kueue: no CRDs in the module $m@$KUEUE_VERSION"
    local crd
    for crd in "$module"/config/components/crd/bases/*.yaml; do
        echo "---"
        cat "$crd"
    done >"$out/kueue-crds.yaml"
}

rm -f "$dest/complete"
# The tools are this repository's, not pinned by a version: rebuilt whenever their sources change.
tools_sum=$(cat "$here"/tools/go.* "$here"/tools/*/*.go | sha256sum | cut -c1-16)
rebuild=""
[[ $(cat "$dest/tools.sum" 2>/dev/null) == "$tools_sum" ]] || rebuild=tools
for entry in "${components[@]}"; do
    read -r -a fields <<<"$entry"
    step "${fields[@]}"
    [[ ${fields[0]} == tools ]] && echo "$tools_sum" >"$dest/tools.sum"
done
touch "$dest/complete"
echo "$dest"
