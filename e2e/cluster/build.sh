#!/usr/bin/env bash
# Builds the end-to-end cluster's components from their Go modules, at the versions of e2e/versions.env,
# into $IX_E2E_CACHE/<key>/ (default /var/cache/ix-device-plugin-e2e), so that a machine builds them once:
#
#   bin/      etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl,
#             containerd, containerd-shim-runc-v2, ctr, runc, helm, cdi-validate, pause
#   cni/bin/  bridge, host-local, loopback
#   complete  written last: the harness only uses a folder that has it
#
# <key> is derived from versions.env, so a version change builds into a fresh folder; Go's module and
# build caches ($IX_E2E_CACHE/go/) are shared by all keys. Each component is skipped when its binaries
# are there already. Needs Go (go on PATH or /usr/local/go/bin), gcc and libseccomp (runc), network access
# to the Go module proxy on a cold build.
#
#   build.sh                 build what is missing, print the folder
#   build.sh --print-dir     print the folder only (exit 1 when it is not complete)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
e2e=$(dirname "$here")
# shellcheck source=../versions.env
source "$e2e/versions.env"

cache_root=${IX_E2E_CACHE:-/var/cache/ix-device-plugin-e2e}
key=$(sha256sum "$e2e/versions.env" | cut -c1-16)
dest=$cache_root/$key

if [[ ${1:-} == --print-dir ]]; then
    echo "$dest"
    [[ -f $dest/complete ]]
    exit
fi

export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "build.sh: Go is needed (https://go.dev/dl/)" >&2; exit 1; }
export GOMODCACHE=$cache_root/go/mod GOCACHE=$cache_root/go/build GOPATH=$cache_root/go/path
export GOFLAGS="-buildvcs=false -trimpath" GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
mkdir -p "$dest/bin" "$dest/cni/bin" "$dest/src"
exec 9>"$cache_root/.lock"
flock 9
log=$dest/build.log

step() { # step NAME BINARY... -- COMMAND...: run COMMAND unless every BINARY is in bin/ or cni/bin/
    local name=$1 missing=0
    shift
    while [[ $1 != -- ]]; do
        [[ -x $dest/$1 ]] || missing=1
        shift
    done
    shift
    if ((missing == 0)); then
        return
    fi
    local start=$SECONDS
    echo "build.sh: $name ..." >&2
    "$@"
    echo "$name: $((SECONDS - start)) s" | tee -a "$log" >&2
}

build_tools() { # pause (the sandbox image's process) and cdi-validate, from e2e/cluster/tools
    rm -rf "$dest/src/tools"
    cp -r "$here/tools" "$dest/src/tools"
    cd "$dest/src/tools"
    go get "tags.cncf.io/container-device-interface@$CDI_VERSION"
    CGO_ENABLED=0 go build -o "$dest/bin/" ./pause ./cdi-validate
}

build_runc() {
    local tags=""
    if pkg-config --exists libseccomp 2>/dev/null; then
        tags=seccomp
    else
        echo "build.sh: libseccomp not found (apt-get install libseccomp-dev): runc without seccomp" >&2
    fi
    GOBIN=$dest/bin CGO_ENABLED=1 go install -tags "$tags" \
        -ldflags "-X main.version=${RUNC_VERSION#v}" "github.com/opencontainers/runc@$RUNC_VERSION"
}

build_containerd() {
    local m=github.com/containerd/containerd/v2
    GOBIN=$dest/bin CGO_ENABLED=0 go install -tags no_btrfs \
        -ldflags "-X $m/version.Version=$CONTAINERD_VERSION" \
        "$m/cmd/containerd@$CONTAINERD_VERSION" "$m/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
        "$m/cmd/ctr@$CONTAINERD_VERSION"
}

build_cni() {
    local m=github.com/containernetworking/plugins/plugins
    GOBIN=$dest/cni/bin CGO_ENABLED=0 go install "$m/main/bridge@$CNI_PLUGINS_VERSION" \
        "$m/main/loopback@$CNI_PLUGINS_VERSION" "$m/ipam/host-local@$CNI_PLUGINS_VERSION"
}

build_helm() {
    GOBIN=$dest/bin CGO_ENABLED=0 go install -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
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
    CGO_ENABLED=0 go build -o "$dest/bin/etcd" .
}

build_kubernetes() {
    # k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and
    # replaces them with ./staging/src/..., which is not in the module: a module that builds its commands
    # replaces each one with the release of the same minor version instead.
    rm -rf "$dest/src/kubernetes"
    mkdir -p "$dest/src/kubernetes"
    cd "$dest/src/kubernetes"
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
    local commands="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl"
    local packages=()
    for module in $commands; do packages+=("k8s.io/kubernetes/cmd/$module"); done
    go get "${packages[@]}"
    local minor=${KUBERNETES_VERSION#v1.}
    minor=${minor%%.*}
    local ldflags="" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    CGO_ENABLED=0 go build -ldflags "-s -w $ldflags" -o "$dest/bin/" "${packages[@]}"
}

rm -f "$dest/complete"
# The tools are this repository's, not pinned by a version: rebuilt whenever their sources change.
tools_sum=$(cat "$here"/tools/go.* "$here"/tools/*/*.go | sha256sum | cut -c1-16)
if [[ $(cat "$dest/tools.sum" 2>/dev/null) != "$tools_sum" ]]; then
    rm -f "$dest/bin/pause"
fi
step tools bin/pause bin/cdi-validate -- build_tools
echo "$tools_sum" >"$dest/tools.sum"
step runc bin/runc -- build_runc
step containerd bin/containerd bin/containerd-shim-runc-v2 bin/ctr -- build_containerd
step cni-plugins cni/bin/bridge cni/bin/host-local cni/bin/loopback -- build_cni
step etcd bin/etcd -- build_etcd
step helm bin/helm -- build_helm
step kubernetes bin/kube-apiserver bin/kube-controller-manager bin/kube-scheduler bin/kubelet bin/kubectl \
    -- build_kubernetes
touch "$dest/complete"
echo "$dest"
