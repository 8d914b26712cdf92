"""Every lane's cluster (IX_E2E_LANE=NAME, e2e/lanes/NAME.env; the default lane without it): the node is Ready, runs a
pod, runs the releases its lane pins, and its containerd serves NRI exactly where the lane turns it on.
`make e2e-lanes` runs this file in each lane, one cluster after another.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.build import current_lane, stack, versions
from harness.cluster import Cluster
from harness.components import NRI_SOCKET
from harness.kube import Kubectl
from harness.pods import busybox_pod, phase_is, wait_pod

from ix_device_plugin.kubelet.sockets import socket_answers


def node_info(admin: Kubectl, node: str, field: str) -> str:
    return admin("get", "node", node, "-o", f"jsonpath={{.status.nodeInfo.{field}}}").strip()


def test_the_node_is_ready(cluster: Cluster, admin: Kubectl) -> None:
    node = admin.get("node", cluster.node_name)
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True", node["status"]["conditions"]


def test_the_lanes_releases_run(cluster: Cluster, admin: Kubectl) -> None:
    pinned = versions()
    assert node_info(admin, cluster.node_name, "kubeletVersion") == pinned["KUBERNETES_VERSION"]
    runtime = f"containerd://{pinned['CONTAINERD_VERSION'].removeprefix('v')}"
    assert node_info(admin, cluster.node_name, "containerRuntimeVersion") == runtime
    server = json.loads(admin("version", "-o", "json"))["serverVersion"]
    assert server["gitVersion"] == pinned["KUBERNETES_VERSION"]


def test_a_busybox_pod_runs_and_prints(cluster: Cluster, admin: Kubectl, namespace: str) -> None:
    lane = current_lane() or "default"
    admin.create(busybox_pod("hello", f"echo hello from lane {lane} on $(hostname)"), "-n", namespace)
    wait_pod(admin, namespace, "hello", phase_is("Succeeded"), "Succeeded")
    assert f"hello from lane {lane} on hello" in admin("logs", "hello", "-n", namespace)


def serving(path: Path) -> bool:
    """Whether something accepts connections on the unix socket at path (a socket file left by a containerd that
    was killed is there, but nobody answers)."""
    return path.is_socket() and socket_answers(path)


def test_nri_is_served_only_where_the_lane_turns_it_on(cluster: Cluster) -> None:
    config = (cluster.containerd_dir / "config.toml").read_text()
    on = stack().nri
    assert serving(Path(NRI_SOCKET)) is on, f"NRI {'on' if on else 'off'} in the lane; containerd's config:\n{config}"
