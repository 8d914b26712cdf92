"""The end-to-end lanes' pure parts: e2e/lanes/*.env over e2e/versions.env (e2e/harness/build.py), and what the
components' command lines and configuration leave out for an older Kubernetes or containerd
(e2e/harness/components.py `Stack`)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from e2e.harness import build, components
from e2e.harness.cluster import FEATURE_GATES
from e2e.harness.components import CURRENT, Binaries, Ports, Stack

pytestmark = pytest.mark.unit

OLDEST = Stack(kubernetes=(1, 29), containerd=(1, 7), nri=True)
BINARIES = Binaries(Path("/cache/bin"), Path("/cache/cni/bin"))
PORTS = Ports(2379, 2380, 6443, 10257, 10259, 10250, 10248)


class FakePki:
    """Any certificate or key of harness.certs.Pki, as one path."""

    def __getattr__(self, name: str) -> FakePki:
        return self

    def __str__(self) -> str:
        return "/pki/file"


def test_current_is_the_default_lanes_stack() -> None:
    assert Stack.of(build.versions("")) == CURRENT


def test_the_lanes_are_found_and_each_is_a_stack() -> None:
    assert build.lanes() == ["containerd-1.7", "k8s-1.29", "nri-off"]
    assert build.stack("k8s-1.29") == OLDEST
    assert build.stack("containerd-1.7") == Stack((1, 29), (1, 7), nri=False)
    assert build.stack("nri-off") == Stack(CURRENT.kubernetes, CURRENT.containerd, nri=False)


def test_lanes_of_the_same_binaries_pin_the_same_versions() -> None:
    """k8s-1.29 and containerd-1.7 differ in containerd's configuration only, so they share one build folder."""

    def pins(lane: str) -> dict[str, str]:
        return {k: v for k, v in build.read_env(build.lane_file(lane)).items() if k != "CONTAINERD_NRI"}

    assert pins("k8s-1.29") == pins("containerd-1.7")
    assert pins("k8s-1.29")["KUBERNETES_STAGING_VERSION"] == "v0." + pins("k8s-1.29")["KUBERNETES_VERSION"][3:]
    assert pins("nri-off") == {}


def test_the_current_lane_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IX_E2E_LANE", "k8s-1.29")
    assert build.current_lane() == "k8s-1.29"
    assert build.versions()["KUBERNETES_VERSION"].startswith("v1.29.")
    assert build.versions()["ETCD_VERSION"] == build.versions("")["ETCD_VERSION"]
    monkeypatch.setenv("IX_E2E_LANE", "")
    assert build.versions() == build.versions("")


def test_an_unknown_lane_names_the_lanes_there_are(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=re.escape("no lane 'k8s-1.0' (the lanes: containerd-1.7, k8s-1.29, nri-off)")):
        build.versions("k8s-1.0")
    monkeypatch.setenv("IX_E2E_LANE", "../versions")
    monkeypatch.delenv("IX_E2E_BIN_DIR", raising=False)
    found, why = build.built_binaries()
    assert found is None and "no lane '../versions'" in why


def test_a_stack_is_on_or_off_for_nri_and_nothing_else() -> None:
    pinned = {"KUBERNETES_VERSION": "v1.29.6", "CONTAINERD_VERSION": "v1.7.35"}
    assert Stack.of(pinned).nri
    with pytest.raises(ValueError, match="CONTAINERD_NRI is on or off"):
        Stack.of({**pinned, "CONTAINERD_NRI": "false"})


def test_an_older_kubernetes_gets_the_feature_gates_it_knows() -> None:
    assert components.known_gates(FEATURE_GATES, CURRENT) == FEATURE_GATES
    assert components.known_gates(FEATURE_GATES, OLDEST) == {}
    at_1_33 = components.known_gates(FEATURE_GATES, Stack((1, 33), (2, 0)))
    assert set(at_1_33) == {"ResourceHealthStatus", "DRAAdminAccess", "DRADeviceTaints", "DRAPartitionableDevices"}
    assert components.known_gates({"SomeGate": False}, OLDEST) == {"SomeGate": False}


def apiserver(stack: Stack, gates: str) -> list[str]:
    return components.apiserver_argv(BINARIES, PORTS, FakePki(), "10.1.2.3", "10.0.0.0/24", gates, stack=stack)


def test_the_api_server_serves_the_resource_betas_its_release_has() -> None:
    gates = components.feature_gates_flag(FEATURE_GATES)
    assert f"--runtime-config={components.RUNTIME_CONFIG}" in apiserver(CURRENT, gates)
    assert f"--feature-gates={gates}" in apiserver(CURRENT, gates)
    assert components.runtime_config(Stack((1, 32), (2, 0))) == "resource.k8s.io/v1beta1=true"
    old = apiserver(OLDEST, components.feature_gates_flag(components.known_gates(FEATURE_GATES, OLDEST)))
    assert not [arg for arg in old if arg.startswith(("--runtime-config", "--feature-gates"))], old


def test_the_controller_manager_and_scheduler_take_no_empty_gates_flag() -> None:
    manager = components.controller_manager_argv(BINARIES, PORTS, FakePki(), Path("/k"), "10.0.0.0/24", "")
    scheduler = components.scheduler_argv(BINARIES, PORTS, Path("/k"), "")
    assert not [arg for arg in manager + scheduler if arg.startswith("--feature-gates")]


def kubelet(stack: Stack) -> dict[str, object]:
    return components.kubelet_config(
        pki=FakePki(),
        ports=PORTS,
        node_ip="10.1.2.3",
        containerd_socket=Path("/run/c.sock"),
        cgroup_root="ix-e2e",
        workdir=Path("/work"),
        feature_gates={},
        stack=stack,
    )


def test_a_kubelet_before_1_30_writes_pod_logs_on_the_host() -> None:
    assert components.pod_logs_on_host(OLDEST) and not components.pod_logs_on_host(Stack((1, 30), (1, 7)))
    assert not components.pod_logs_on_host(CURRENT)


def test_the_kubelet_configuration_has_only_fields_its_release_knows() -> None:
    current = kubelet(CURRENT)
    assert current["failCgroupV1"] is False and current["podLogsDir"] == "/work/pod-logs"
    assert list(current)[:3] == ["apiVersion", "kind", "failCgroupV1"]
    assert not {"failCgroupV1", "podLogsDir"} & set(kubelet(OLDEST))
    at_1_30 = kubelet(Stack((1, 30), (1, 7)))
    assert "podLogsDir" in at_1_30 and "failCgroupV1" not in at_1_30
    assert set(current) - set(kubelet(OLDEST)) == {"failCgroupV1", "podLogsDir"}


def test_kube_proxy_before_1_31_turns_its_nftables_mode_on() -> None:
    old = components.kube_proxy_argv(BINARIES, Path("/k"), "node", "10.244.0.0/24", 1, 2, OLDEST)
    assert old[-1] == "--feature-gates=NFTablesProxyMode=true" and "--proxy-mode=nftables" in old
    assert components.kube_proxy_cleanup_argv(BINARIES) == [
        "/cache/bin/kube-proxy",
        "--cleanup",
        "--proxy-mode=nftables",
    ]
    nft = "add table ip kube-proxy; delete table ip kube-proxy; add table ip6 kube-proxy; delete table ip6 kube-proxy"
    assert components.kube_proxy_cleanup_argv(BINARIES, OLDEST) == ["nft", nft]  # no ipset needed
    current = components.kube_proxy_argv(BINARIES, Path("/k"), "node", "10.244.0.0/24", 1, 2)
    assert not [arg for arg in current if arg.startswith("--feature-gates")]


def containerd(stack: Stack) -> dict[str, object]:
    text = components.containerd_config(
        BINARIES, Path("/work/containerd"), Path("/work/containerd/c.sock"), Path("/work/cdi"), Path("/net.d"), stack
    )
    return tomllib.loads(text)


def test_containerd_2_serves_nri_as_the_stack_says() -> None:
    on = containerd(CURRENT)
    assert on["version"] == 4 and on["plugins"]["io.containerd.nri.v1.nri"]["disable"] is False
    off = containerd(Stack(CURRENT.kubernetes, CURRENT.containerd, nri=False))
    assert off["plugins"]["io.containerd.nri.v1.nri"] == {"disable": True, "socket_path": components.NRI_SOCKET}
    del on["plugins"]["io.containerd.nri.v1.nri"], off["plugins"]["io.containerd.nri.v1.nri"]
    assert on == off


def test_containerd_1_7_gets_its_version_2_configuration() -> None:
    config = containerd(OLDEST)
    assert config["version"] == 2
    assert config["grpc"] == {"address": "/work/containerd/c.sock"}
    assert config["ttrpc"] == {"address": "/work/containerd/c.sock.ttrpc"}
    plugins = config["plugins"]
    assert plugins["io.containerd.internal.v1.opt"] == {"path": "/work/containerd/opt"}
    cri = plugins["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/work/cdi"]
    assert cri["sandbox_image"] == "localhost/ix-e2e/pause:1"
    assert cri["restrict_oom_score_adj"] is True and cri["netns_mounts_under_state_dir"] is True
    assert cri["cni"] == {"bin_dir": "/cache/cni/bin", "conf_dir": "/net.d"}
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"BinaryName": "/cache/bin/runc", "Root": "/work/containerd/runc", "SystemdCgroup": False}
    assert plugins["io.containerd.nri.v1.nri"] == {"disable": False, "socket_path": "/var/run/nri/nri.sock"}
    off = containerd(Stack((1, 29), (1, 7), nri=False))
    assert off["plugins"]["io.containerd.nri.v1.nri"]["disable"] is True
