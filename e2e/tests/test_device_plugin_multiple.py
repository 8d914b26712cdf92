"""The kubelet's own "Device Plugin Multiple" scenarios (test/e2e_node/device_plugin_multiple_test.go: a basic rollout
with zero downtime, DP2 taking long to start working, DP2 changing its mind) with the device plugin as host processes
over the same simulated chips, as two pods of its DaemonSet overlap during an update: each serves a socket of its own
(POD_UID), the second registers beside the first (--zero-downtime-upgrade true; the 1.37 kubelet keeps an endpoint
per socket and the newest registration serves), and one of them, holding the node's role, acts for the node.

Throughout, the Node's iluvatar.com/gpu (sampled and watched) and the kubelet's allocatable devices (pod-resources)
are recorded every 0.1 s and must never drop; pods asking for a GPU are admitted, run and see their board, served by
the plugin the kubelet's rule names; the pod on standby writes nothing node-wide.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.kube import Kubectl
from harness.nodewatch import ResourceRecorder, kubelet_allocatable
from harness.plugin import PluginRun, bi_v150_chips, expected_nodes, start_device_plugin
from harness.pods import SHOW_DEVICES, STAY, busybox_pod, node_resource, run_and_read, shown_devices
from harness.waits import stays, until

from ix_device_plugin.deviceplugin.endpoint import plugin_socket

RESOURCE = "iluvatar.com/gpu"
CHIPS = bi_v150_chips()
BOARDS = (CHIPS[0:2], CHIPS[2:4])
HOLD = 5.0  # seconds each state of the overlap is held and recorded (the kubelet's test holds its for 30 s)
HANDOVER = 3.0  # seconds the standby may take to act for the node once the acting plugin has stopped
ACTING = "ix_device_plugin_acting_for_node"
FEATURE_FILE = "ix-device-plugin"
CDI_SPEC = "iluvatar.com-gpu.yaml"


@dataclass
class Node:
    """Plugins of the node as its DaemonSet's pods are, sharing the node-wide directories (NFD features, the role's
    lock and the node-health record, the CDI specs); each with its own POD_UID. All are stopped at the end."""

    cluster: Cluster
    workdir: Path
    name: str
    plugins: dict[str, PluginRun] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)

    @property
    def features(self) -> Path:
        return self.workdir / "features.d"

    @property
    def plugins_dir(self) -> Path:
        return self.workdir / "kubelet-plugins"

    def start(self, which: str, zero_downtime: str = "true") -> PluginRun:
        """A plugin pod `which` over the node's chips, ready (/readyz)."""
        self.plugins_dir.mkdir(parents=True, exist_ok=True)
        self.uids[which] = str(uuid.uuid4())
        env = {"POD_UID": self.uids[which], "ZERO_DOWNTIME_UPGRADE": zero_downtime}
        name = f"device-plugin-multiple-{self.name}-{which}"
        started = start_device_plugin(
            self.cluster, self.workdir / which, name, chips=CHIPS, env=env,
            features=self.features, plugins_dir=self.plugins_dir,
        )  # fmt: skip
        self.plugins[which] = started
        started.wait_ready()
        return started

    def socket(self, which: str) -> Path:
        return plugin_socket(self.cluster.device_plugin_dir, self.uids[which])

    def written(self) -> dict[str, tuple[int, int]]:
        """The node-wide files an acting plugin writes, as (inode, mtime): the CDI spec and the NFD feature file."""
        paths = {"cdi": self.cluster.cdi_dir / CDI_SPEC, "features": self.features / FEATURE_FILE}
        return {name: (os.stat(path).st_ino, os.stat(path).st_mtime_ns) for name, path in paths.items()}

    def stop_all(self) -> None:
        for plugin in self.plugins.values():
            plugin.stop()


@pytest.fixture
def node(cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Node]:
    started = Node(cluster, tmp_path, request.node.name.removeprefix("test_")[:24])
    try:
        yield started
    finally:
        started.stop_all()


def acting(plugin: PluginRun) -> float | None:
    return plugin.metric(ACTING)


def allocations(plugin: PluginRun) -> float:
    """The Allocate calls the plugin has answered."""
    return plugin.metric("ix_device_plugin_calls_total", method="Allocate") or 0.0


def wait_offered(cluster: Cluster, plugin: PluginRun) -> None:
    until(
        lambda: node_resource(cluster.admin, cluster.node_name, RESOURCE) == (2, 2),
        60,
        f"node {RESOURCE} 2 of 2",
        [plugin.process.log, cluster.processes["kubelet"].log],
    )


def gpu_pod(admin: Kubectl, namespace: str, name: str) -> int:
    """A pod asking for one GPU, Running; the board it sees (exactly that board's device nodes and variables)."""
    _, output = run_and_read(admin, namespace, busybox_pod(name, SHOW_DEVICES + STAY, gpus=1))
    nodes, env = shown_devices(output)
    visible = env["IX_VISIBLE_DEVICES"].split(",")
    (board,) = [index for index, chips in enumerate(BOARDS) if [chip.uuid for chip in chips] == sorted(visible)]
    assert nodes == expected_nodes(BOARDS[board]), nodes
    assert env["ILUVATAR_COREX_VISIBLE_DEVICES"] == env["IX_VISIBLE_DEVICES"]
    return board


def still_running(admin: Kubectl, namespace: str, *names: str) -> None:
    for name in names:
        status = admin.get("pod", name, namespace)["status"]
        assert status["phase"] == "Running", (name, status)
        assert status["containerStatuses"][0]["restartCount"] == 0, (name, status)


def on_standby_beside(acting_plugin: PluginRun, standby: PluginRun) -> None:
    """The second plugin registered beside the first, which acts for the node alone: the role's gauge, and the
    per-GPU metrics (node-wide) exported by the acting one only."""
    assert "registering beside it (--zero-downtime-upgrade is true)" in standby.process.log_text()
    assert (acting(acting_plugin), acting(standby)) == (1.0, 0.0)
    until(lambda: "ix_gpu_temperature{" in acting_plugin.metrics(), 10, "the acting plugin's GPU metrics")
    assert "ix_gpu_temperature{" not in standby.metrics()


def roles_hold(acting_plugin: PluginRun, *standbys: PluginRun) -> None:
    """For HOLD seconds (a state of the overlap, recorded by the ResourceRecorder meanwhile) acting_plugin alone acts
    for the node and each standby stays one."""

    def held() -> bool:
        return acting(acting_plugin) == 1.0 and all(acting(standby) == 0.0 for standby in standbys)

    names = ", ".join(standby.process.name for standby in standbys) or "none"
    logs = [plugin.process.log for plugin in (acting_plugin, *standbys)]
    stays(held, HOLD, f"{acting_plugin.process.name} acting for the node (standby: {names})", logs)


def takes_over(cluster: Cluster, stopped: PluginRun, standby: PluginRun) -> float:
    """SIGTERM to the acting plugin; the seconds from its exit until the standby acts for the node."""
    assert stopped.stop() == 0
    exited = time.monotonic()
    until(lambda: acting(standby) == 1.0, HANDOVER, "the standby acting for the node", [standby.process.log])
    return time.monotonic() - exited


def serving_pod1(cluster: Cluster, admin: Kubectl, namespace: str, node: Node) -> tuple[PluginRun, int]:
    """DP1 started and offering its GPUs, and Pod1 admitted: DP1 and Pod1's board."""
    dp1 = node.start("dp1")
    wait_offered(cluster, dp1)
    return dp1, gpu_pod(admin, namespace, "pod1")


def beside_serving_pod2(admin: Kubectl, namespace: str, node: Node, dp1: PluginRun, first: int) -> PluginRun:
    """DP2 started, registered beside DP1 and on standby; after HOLD, Pod2 is admitted on another board and DP2, the
    newest registration, answers its Allocate. DP2."""
    dp2 = node.start("dp2")
    on_standby_beside(dp1, dp2)
    roles_hold(dp1, dp2)
    assert gpu_pod(admin, namespace, "pod2") != first
    assert (allocations(dp1), allocations(dp2)) == (1, 1)
    return dp2


def pod3_takes_the_board_pod1_freed(admin: Kubectl, namespace: str, first: int) -> None:
    """Pod1 deleted: Pod3 gets its board, and Pod2 and Pod3 run without a restart."""
    admin.delete("pod", "pod1", namespace)
    assert gpu_pod(admin, namespace, "pod3") == first
    still_running(admin, namespace, "pod2", "pod3")


def report(cluster: Cluster, name: str, recorder: ResourceRecorder, **figures: object) -> None:
    summary = {**figures, **recorder.summary()}
    (cluster.logdir / f"device-plugin-multiple-{name}.json").write_text(json.dumps(summary, indent=2))
    print(f"device plugin multiple ({name}): {json.dumps(summary)}")


def test_basic_rollout_of_two_plugins_with_zero_downtime(
    cluster: Cluster, admin: Kubectl, namespace: str, node: Node
) -> None:
    """DP1 serves Pod1; DP2 starts beside it and registers at once; Pod2 is admitted while both run (DP2 answers its
    Allocate, the newest registration); DP1 stops and DP2 acts for the node; Pod3 takes the board Pod1 freed."""
    dp1, first = serving_pod1(cluster, admin, namespace, node)
    assert allocations(dp1) == 1
    written = node.written()
    with ResourceRecorder(cluster, RESOURCE) as recorder:
        dp2 = beside_serving_pod2(admin, namespace, node, dp1, first)
        assert node.written() == written, "a node-wide file was written during the overlap"
        handover = takes_over(cluster, dp1, dp2)
        assert not node.socket("dp1").exists()
        roles_hold(dp2)
        pod3_takes_the_board_pod1_freed(admin, namespace, first)
        assert allocations(dp2) == 2
    report(cluster, "basic", recorder, handover_seconds=round(handover, 3))
    recorder.check_steady(2, 2)
    dp2.stop()  # the control: the last plugin gone, the kubelet's view drops at once
    until(lambda: kubelet_allocatable(cluster, RESOURCE) == 0, 10, "the kubelet's devices unhealthy", [])


def test_a_second_plugin_that_takes_long_to_start_working_leaves_the_first_serving(
    cluster: Cluster, admin: Kubectl, namespace: str, node: Node
) -> None:
    """DP2 starts but does not register for a long time (--zero-downtime-upgrade false: ready, waiting on standby
    for DP1 to stop); DP1 keeps serving, Pod2 gets its GPU from DP1. DP2 gives up (stopped: it takes nothing of DP1's
    with it); DP3, its retry, registers beside DP1; DP1 stops, DP3 acts for the node and serves Pod3."""
    dp1, first = serving_pod1(cluster, admin, namespace, node)
    with ResourceRecorder(cluster, RESOURCE) as recorder:
        dp2 = node.start("dp2", zero_downtime="false")
        assert "standby: another pod of the plugin serves this node; registering once it stops" in (
            dp2.process.log_text()
        )
        assert not node.socket("dp2").exists()
        assert (acting(dp1), acting(dp2)) == (1.0, 0.0)
        roles_hold(dp1, dp2)
        assert not node.socket("dp2").exists()
        second = gpu_pod(admin, namespace, "pod2")
        assert second != first
        assert (allocations(dp1), allocations(dp2)) == (2, 0)
        assert dp2.stop() == 0
        assert node.socket("dp1").exists() and acting(dp1) == 1.0
        dp3 = node.start("dp3")
        on_standby_beside(dp1, dp3)
        roles_hold(dp1, dp3)
        handover = takes_over(cluster, dp1, dp3)
        roles_hold(dp3)
        pod3_takes_the_board_pod1_freed(admin, namespace, first)
        assert allocations(dp3) == 1
    report(cluster, "late", recorder, handover_seconds=round(handover, 3))
    recorder.check_steady(2, 2)


def test_a_second_plugin_that_changes_its_mind_leaves_the_first_serving(
    cluster: Cluster, admin: Kubectl, namespace: str, node: Node
) -> None:
    """DP2 registers beside DP1 and serves Pod2, then stops first (a rollout undone): DP1, still acting for the node,
    serves on and the kubelet turns to it again for Pod3; nothing drops."""
    dp1, first = serving_pod1(cluster, admin, namespace, node)
    written = node.written()
    with ResourceRecorder(cluster, RESOURCE) as recorder:
        dp2 = beside_serving_pod2(admin, namespace, node, dp1, first)
        assert dp2.stop() == 0
        assert not node.socket("dp2").exists() and node.socket("dp1").exists()
        roles_hold(dp1)
        assert node.written() == written, "a node-wide file was written while the standby ran or stopped"
        pod3_takes_the_board_pod1_freed(admin, namespace, first)
        assert allocations(dp1) == 2
    report(cluster, "changed-mind", recorder)
    recorder.check_steady(2, 2)
