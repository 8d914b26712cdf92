#!/usr/bin/env bash
# Builds a stand-in for the official python:3.11-slim image from Debian packages alone, for hosts that
# reach a Debian mirror but no container registry. The result looks like the official image where the
# Dockerfile cares: `python` and `pip` on PATH and pip allowed to install into the system interpreter.
#
# Usage: build-base-image.sh [TAG]    (needs root, debootstrap and buildah)
# Environment: SUITE (default bookworm, whose python3 is 3.11), MIRROR, BUILDAH (buildah command line).
set -euo pipefail

tag="${1:-localhost/ix-python-base:3.11-bookworm}"
suite="${SUITE:-bookworm}"
mirror="${MIRROR:-http://deb.debian.org/debian}"
read -r -a buildah <<<"${BUILDAH:-buildah --storage-driver vfs}"

for tool in debootstrap "${buildah[0]}"; do
    command -v "$tool" >/dev/null || { echo "build-base-image: $tool not found" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "build-base-image: debootstrap needs root" >&2; exit 1; }

workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT
rootfs="$workdir/rootfs"

echo "build-base-image: debootstrap $suite (minbase + python3, python3-pip)"
debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates \
    "$suite" "$rootfs" "$mirror" >"$workdir/debootstrap.log" 2>&1 || {
    tail -n 30 "$workdir/debootstrap.log" >&2
    exit 1
}

# Make the interpreter behave like the official image: unversioned names, no PEP 668 marker.
ln -sf python3 "$rootfs/usr/bin/python"
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
# Trim what a runtime base never needs.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/var/log/* "$rootfs"/tmp/* "$rootfs"/dev/*
find "$rootfs/usr/lib" -name __pycache__ -type d -prune -exec rm -rf {} +

tar --numeric-owner -C "$rootfs" -cf "$workdir/rootfs.tar" .
ctr="$("${buildah[@]}" from scratch)"
trap '"${buildah[@]}" rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$workdir"' EXIT
"${buildah[@]}" add "$ctr" "$workdir/rootfs.tar" /
"${buildah[@]}" config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 \
    --cmd python3 \
    --label org.opencontainers.image.description="Debian $suite with python3, built by debootstrap" \
    "$ctr"
"${buildah[@]}" commit --rm "$ctr" "$tag"
echo "build-base-image: committed $tag"
