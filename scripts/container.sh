#!/usr/bin/env bash
# Container image helper for the Makefile: finds a usable engine, builds the image, smoke-tests it.
#
#   container.sh engine              print the first usable engine (docker, podman, buildah) or nothing
#   container.sh build IMAGE         build IMAGE from the Dockerfile; skips (exit 0) when no engine is usable
#   container.sh smoke IMAGE         run `--version` and `demo` in IMAGE
#   container.sh save IMAGE FILE     write IMAGE as a docker archive named as a node resolves IMAGE
#                                    (ix-device-plugin:1.0 -> docker.io/library/ix-device-plugin:1.0), so
#                                    that `ctr -n k8s.io images import FILE` serves the manifests unchanged
#
# Environment: CONTAINER_ENGINE (use this engine only), BASE_IMAGE, VERSION, SOURCE_URL,
# BUILDAH_STORAGE (default vfs, which works without kernel overlay support; podman uses the same store, so
# that it finds the base image `make base-image` committed with buildah), BUILDAH_ISOLATION
# (default chroot, which works inside unprivileged containers), PIP_CERT (a CA bundle file handed to
# pip in the builder stage as the pip-cert secret, for TLS-intercepting proxies).
set -euo pipefail

buildah_cmd=(buildah --storage-driver "${BUILDAH_STORAGE:-vfs}")
podman_cmd=(podman --storage-driver "${BUILDAH_STORAGE:-vfs}")
isolation="${BUILDAH_ISOLATION:-chroot}"

usable() {
    case "$1" in
        # A docker client without a reachable daemon fails `docker info`.
        docker) command -v docker >/dev/null && docker info >/dev/null 2>&1 ;;
        podman) command -v podman >/dev/null && "${podman_cmd[@]}" info >/dev/null 2>&1 ;;
        buildah) command -v buildah >/dev/null && "${buildah_cmd[@]}" info >/dev/null 2>&1 ;;
        *) echo "container.sh: unknown engine $1" >&2; return 1 ;;
    esac
}

engine() {
    local candidates=(docker podman buildah)
    [ -n "${CONTAINER_ENGINE:-}" ] && candidates=("$CONTAINER_ENGINE")
    for candidate in "${candidates[@]}"; do
        if usable "$candidate"; then
            echo "$candidate"
            return 0
        fi
    done
    return 0
}

build() {
    local image="$1" engine_name
    engine_name="$(engine)"
    if [ -z "$engine_name" ]; then
        echo "container.sh: SKIPPING the image $image: no usable container engine" \
            "(tried ${CONTAINER_ENGINE:-docker, podman, buildah}; docker needs a running daemon)." >&2
        return 0
    fi
    local args=(-f Dockerfile -t "$image"
        --build-arg "VERSION=${VERSION:-dev}" --build-arg "SOURCE_URL=${SOURCE_URL:-}")
    [ -n "${BASE_IMAGE:-}" ] && args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
    [ -n "${PIP_CERT:-}" ] && [ -s "$PIP_CERT" ] && args+=(--secret "id=pip-cert,src=$PIP_CERT")
    echo "container.sh: building $image with $engine_name (base ${BASE_IMAGE:-from the Dockerfile})"
    local status=0
    case "$engine_name" in
        docker) DOCKER_BUILDKIT=1 docker build "${args[@]}" . || status=$? ;;
        # No layer cache with buildah's vfs store: a cached builder stage is not there to bind-mount its
        # wheels from (`couldn't find .../wheels on host`), so every second build failed.
        podman) "${podman_cmd[@]}" build --layers=false "${args[@]}" . || status=$? ;;
        buildah) "${buildah_cmd[@]}" bud --isolation "$isolation" --layers=false "${args[@]}" . || status=$? ;;
    esac
    if [ "$status" -ne 0 ]; then
        echo "container.sh: build failed. Without a reachable registry, build a base from Debian" \
            "packages first: make base-image, then make image BASE_IMAGE=<its tag>." >&2
        return "$status"
    fi
    size "$engine_name" "$image"
}

size() {
    case "$1" in
        docker) docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$2" ;;
        podman) "${podman_cmd[@]}" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$2" ;;
        buildah) "${buildah_cmd[@]}" images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$2" ;;
    esac
}

in_image() {
    local engine_name="$1" image="$2"
    shift 2
    case "$engine_name" in
        docker) docker run --rm "$image" "$@" ;;
        podman) "${podman_cmd[@]}" run --rm "$image" "$@" ;;
        buildah)
            local ctr status=0
            ctr="$("${buildah_cmd[@]}" from "$image")"
            "${buildah_cmd[@]}" run --isolation "$isolation" "$ctr" -- ix-device-plugin "$@" || status=$?
            "${buildah_cmd[@]}" rm "$ctr" >/dev/null
            return "$status"
            ;;
    esac
}

smoke() {
    local image="$1" engine_name
    engine_name="$(engine)"
    [ -n "$engine_name" ] || { echo "container.sh: no usable container engine" >&2; return 1; }
    echo "+ $image --version"
    in_image "$engine_name" "$image" --version
    echo "+ $image demo"
    in_image "$engine_name" "$image" demo
}

# The fully qualified name the kubelet and containerd give an image reference (docker.io is the default).
qualified() {
    local image="$1" first="${1%%/*}"
    if [[ $image != */* ]]; then
        echo "docker.io/library/$image"
    elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
        echo "docker.io/$image"
    else
        echo "$image"
    fi
}

save() {
    local image="$1" file="$2" engine_name name
    engine_name="$(engine)"
    [ -n "$engine_name" ] || { echo "container.sh: no usable container engine" >&2; return 1; }
    name="$(qualified "$image")"
    mkdir -p "$(dirname "$file")"
    rm -f "$file"
    case "$engine_name" in
        docker) docker tag "$image" "$name" && docker save -o "$file" "$name" ;;
        podman) "${podman_cmd[@]}" tag "$image" "$name" && "${podman_cmd[@]}" save --format docker-archive -o "$file" "$name" ;;
        buildah) "${buildah_cmd[@]}" push "$image" "docker-archive:$file:$name" ;;
    esac
    echo "container.sh: $file holds $name (load it on a node: ctr -n k8s.io images import $file)"
}

case "${1:-}" in
    engine) engine ;;
    build) build "${2:?image name}" ;;
    smoke) smoke "${2:?image name}" ;;
    save) save "${2:?image name}" "${3:?archive file}" ;;
    *) echo "usage: $0 engine | build IMAGE | smoke IMAGE | save IMAGE FILE" >&2; exit 2 ;;
esac
