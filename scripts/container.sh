#!/usr/bin/env bash
# Container image helper for the Makefile: finds a usable engine, builds the image, smoke-tests it.
#
#   container.sh engine              print the first engine (docker, podman, buildah) that builds a one-step
#                                    image here, or nothing; stderr says the choice and why others were skipped
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
# pip in the builder stage as the pip-cert secret, for TLS-intercepting proxies), CONTAINER_PROBE_TIMEOUT
# (seconds an engine has to build the one-step test image, default 300).
set -euo pipefail

buildah_cmd=(buildah --storage-driver "${BUILDAH_STORAGE:-vfs}")
podman_cmd=(podman --storage-driver "${BUILDAH_STORAGE:-vfs}")
isolation="${BUILDAH_ISOLATION:-chroot}"

probe_image="localhost/ix-device-plugin-engine-probe:$$"  # one per run: runs may share a store
probe_timeout="${CONTAINER_PROBE_TIMEOUT:-300}"

# engine_build ENGINE ARG...: ENGINE's build of a Containerfile, as `build` runs it (and the probe, so that
# what the probe proves is what `build` needs).
engine_build() {
    local name="$1"
    shift
    case "$name" in
        docker) DOCKER_BUILDKIT=1 docker build "$@" ;;
        # No layer cache with buildah's vfs store: a cached builder stage is not there to bind-mount its
        # wheels from (`couldn't find .../wheels on host`), so every second build failed.
        podman) "${podman_cmd[@]}" build --layers=false "$@" ;;
        buildah) "${buildah_cmd[@]}" bud --isolation "$isolation" --layers=false "$@" ;;
    esac
}

remove_image() {
    case "$1" in
        docker) docker rmi -f "$2" ;;
        podman) "${podman_cmd[@]}" rmi -f "$2" ;;
        buildah) "${buildah_cmd[@]}" rmi -f "$2" ;;
    esac
}

# probe_context DIR: a build context whose Containerfile runs a command, the cheapest real build: an engine
# that cannot start a container here (podman's crun on a cgroup v1 host: "cgroups in hybrid mode not
# supported") fails at the RUN step, not at `info`. The command is the host's `true` with its loader and
# libraries, so that no image has to be pulled.
probe_context() {
    local dir="$1" binary path
    binary="$(type -P true)"
    local files=("$binary")
    if ldd "$binary" >/dev/null 2>&1; then
        while read -r path; do files+=("$path"); done < <(ldd "$binary" | grep -o '/[^ ]*')
    fi
    mkdir -p "$dir/rootfs"
    for path in "${files[@]}"; do cp -L --parents "$path" "$dir/rootfs/"; done
    printf 'FROM scratch\nCOPY rootfs/ /\nRUN ["%s"]\n' "$binary" >"$dir/Containerfile"
}

# can_build ENGINE CONTEXT: true when ENGINE builds the probe image; otherwise says why on stderr.
can_build() {
    local name="$1" context="$2" output status=0
    if ! command -v "$name" >/dev/null; then
        echo "container.sh: $name: not installed" >&2
        return 1
    fi
    output="$(timeout "$probe_timeout" bash "${BASH_SOURCE[0]}" engine-build "$name" \
        -f "$context/Containerfile" -t "$probe_image" "$context" 2>&1)" || status=$?
    remove_image "$name" "$probe_image" >/dev/null 2>&1 || true
    if [ "$status" -ne 0 ]; then
        [ "$status" -eq 124 ] && output="no answer within ${probe_timeout} s"
        echo "container.sh: $name: skipped, it cannot build a one-step image here:" \
            "$(printf '%s\n' "$output" | sed -n 's/^[[:space:]]*//; /./p' | tail -n 4 | paste -s -d ' ' | cut -c 1-600)" >&2
        return 1
    fi
}

# engine: the first engine (CONTAINER_ENGINE, or docker, podman, buildah) that builds the probe image, on
# stdout; on stderr the choice and why each one before it was skipped. Nothing when none can.
engine() {
    local candidates=(docker podman buildah) context status=1
    [ -n "${CONTAINER_ENGINE:-}" ] && candidates=("$CONTAINER_ENGINE")
    for candidate in "${candidates[@]}"; do
        case "$candidate" in
            docker | podman | buildah) ;;
            *) echo "container.sh: unknown engine $candidate (docker, podman, buildah)" >&2; return 0 ;;
        esac
    done
    context="$(mktemp -d)"
    probe_context "$context"
    for candidate in "${candidates[@]}"; do
        if can_build "$candidate" "$context"; then
            echo "container.sh: using $candidate: it builds an image here" >&2
            echo "$candidate"
            status=0
            break
        fi
    done
    rm -rf "$context"
    if [ "$status" -ne 0 ]; then
        local tried
        tried="$(printf '%s, ' "${candidates[@]}")"
        echo "container.sh: no engine can build an image here" \
            "(tried ${tried%, }${CONTAINER_ENGINE:+, as CONTAINER_ENGINE says})" >&2
    fi
    return 0
}

build() {
    local image="$1" engine_name
    engine_name="$(engine)"
    if [ -z "$engine_name" ]; then
        echo "container.sh: SKIPPING the image $image: no usable container engine (see above)." >&2
        return 0
    fi
    local args=(-f Dockerfile -t "$image"
        --build-arg "VERSION=${VERSION:-dev}" --build-arg "SOURCE_URL=${SOURCE_URL:-}")
    [ -n "${BASE_IMAGE:-}" ] && args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
    [ -n "${PIP_CERT:-}" ] && [ -s "$PIP_CERT" ] && args+=(--secret "id=pip-cert,src=$PIP_CERT")
    echo "container.sh: building $image with $engine_name (base ${BASE_IMAGE:-from the Dockerfile})"
    local status=0
    engine_build "$engine_name" "${args[@]}" . || status=$?
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
    engine-build) shift; engine_build "$@" ;; # the probe's build, under timeout (can_build)
    build) build "${2:?image name}" ;;
    smoke) smoke "${2:?image name}" ;;
    save) save "${2:?image name}" "${3:?archive file}" ;;
    *) echo "usage: $0 engine | build IMAGE | smoke IMAGE | save IMAGE FILE" >&2; exit 2 ;;
esac
