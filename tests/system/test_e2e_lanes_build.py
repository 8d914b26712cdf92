"""e2e/cluster/build.sh for a lane (e2e/lanes/NAME.env over e2e/versions.env): the folder it keys, what it builds and
what it links from the default lane's folder, how it verifies. Go and the built binaries are stand-ins (those of
test_e2e_fresh_machine): nothing is compiled."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_e2e_fresh_machine import E2E_DIR, FakeBuildHost, clean_env, fake_binary, version_outputs

LANE_KUBERNETES = "v1.29.15"
LANE_CONTAINERD = "v1.7.35"


def lane_outputs() -> dict[str, str]:
    """What k8s-1.29's binaries print when build.sh asks their version (containerd 1.x names its module without /v2)."""
    outputs = version_outputs(containerd=LANE_CONTAINERD)
    default = version_outputs()["bin/kubectl"].split()[2]
    for name, said in outputs.items():
        said = said.replace(default, LANE_KUBERNETES)
        outputs[name] = said.replace("github.com/containerd/containerd/v2 ", "github.com/containerd/containerd ")
    return outputs


# containerd 1.x is built in a copy of its module (its go.mod has an exclude directive, which `go install PKG@VERSION`
# refuses): the stand-in go names a module folder too.
MODULE_DIR_GO = """#!/bin/bash
"$(dirname "$0")/go.stand-in" "$@"
if [[ $1 == mod && $2 == download ]]; then
    mkdir -p "$FAKE_BUILDS/module"
    printf '\\t"Dir": "%s",\\n' "$FAKE_BUILDS/module"
fi
"""


@pytest.fixture
def host(tmp_path: Path) -> FakeBuildHost:
    made = FakeBuildHost(tmp_path)
    made.wrap_go(MODULE_DIR_GO)
    return made


def folder(host: FakeBuildHost, lane: str) -> Path:
    result = host.build("--print-dir", lane)
    return Path(result.stdout.strip())


def test_the_default_lanes_folder_is_keyed_by_versions_env_alone(host: FakeBuildHost) -> None:
    key = hashlib.sha256((E2E_DIR / "versions.env").read_bytes()).hexdigest()[:16]
    assert host.dest == host.cache / key
    assert folder(host, "nri-off") == host.dest  # pins no version: the default lane's binaries
    assert folder(host, "k8s-1.29") == folder(host, "containerd-1.7") != host.dest


def test_an_unknown_lane_is_refused_naming_the_lanes(host: FakeBuildHost) -> None:
    for args in (["k8s-1.0"], ["--print-dir", "../versions"]):
        result = host.build(*args)
        assert result.returncode == 1
        assert "(the lanes: containerd-1.7 k8s-1.29 nri-off)" in result.stderr, result.stderr


def test_a_lane_builds_its_own_releases_and_links_the_rest_from_the_default_lane(host: FakeBuildHost) -> None:
    host.fill_cache(version_outputs())
    host.go_builds(version_outputs())
    assert host.build().returncode == 0  # the default lane complete (its tools built: they are not pinned)
    host.go_log.write_text("")
    host.go_builds(lane_outputs())
    result = host.build("k8s-1.29")
    assert result.returncode == 0, result.stderr
    lane = folder(host, "k8s-1.29")
    assert result.stdout.strip() == str(lane) and (lane / "complete").exists()
    assert host.go_installs() == []  # nothing of the default lane's versions built again
    log = host.go_log.read_text()
    assert f"mod download -json github.com/containerd/containerd@{LANE_CONTAINERD}\n" in log
    assert "./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr" in log
    assert f"k8s.io/kubernetes@{LANE_KUBERNETES}" in log
    for shared in ("bin/runc", "bin/etcd", "bin/helm", "bin/pause", "cni/bin/bridge"):
        assert (lane / shared).stat().st_ino == (host.dest / shared).stat().st_ino, shared
    for own in ("bin/kubelet", "bin/containerd"):
        assert (lane / own).stat().st_ino != (host.dest / own).stat().st_ino, own
    assert "runc: linked from" in result.stderr
    assert host.build("--verify", "k8s-1.29").returncode == 0
    assert host.build("containerd-1.7").stderr == ""  # the same folder, complete


def test_a_lane_builds_a_shared_component_the_default_lane_has_not_verified(host: FakeBuildHost) -> None:
    host.fill_cache(version_outputs(seccomp=False))
    host.go_builds(lane_outputs())
    result = host.build("k8s-1.29")
    assert result.returncode == 0, result.stderr
    assert "runc" in host.go_installs() and "runc: linked from" not in result.stderr
    runc = subprocess.run([folder(host, "k8s-1.29") / "bin/runc"], capture_output=True, text=True, check=True)
    assert "libseccomp" in runc.stdout


def test_a_lanes_verify_asks_for_its_own_releases(host: FakeBuildHost) -> None:
    lane = folder(host, "k8s-1.29")
    for relative, output in version_outputs().items():
        fake_binary(lane / relative, output)
    result = host.build("--verify", "k8s-1.29")
    assert result.returncode == 1
    named = {line.split(":")[1].strip().removeprefix(f"{lane}/") for line in result.stderr.splitlines()}
    kubernetes = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "kube-proxy")
    containerd = ("containerd", "ctr", "containerd-shim-runc-v2")
    assert named == {f"bin/{name}" for name in kubernetes + containerd}
    ctr = [line for line in result.stderr.splitlines() if "bin/ctr" in line]
    assert f'does not report "github.com/containerd/containerd {LANE_CONTAINERD}"' in ctr[0]


def test_the_suite_names_the_lanes_build_when_its_folder_is_not_complete(host: FakeBuildHost) -> None:
    lookup = "import sys; sys.path.insert(0, sys.argv[1]); from harness.build import built_binaries as b; print(b()[1])"
    env = clean_env(PATH=f"{host.bin}:{os.environ['PATH']}", IX_E2E_CACHE=str(host.cache), IX_E2E_LANE="k8s-1.29")
    said = subprocess.run(
        [sys.executable, "-c", lookup, str(E2E_DIR)], capture_output=True, text=True, env=env, timeout=60, check=True
    ).stdout
    assert said.startswith(f"{folder(host, 'k8s-1.29')} is not complete: run `e2e/cluster/build.sh k8s-1.29`"), said
