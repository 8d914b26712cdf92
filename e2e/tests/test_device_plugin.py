"""The device plugin (`ix-device-plugin run`, a host process over simulated chips) with the real kubelet's
device manager, containerd and the pod-resources API.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.kube import Kubectl
from harness.plugin import DEVICE_MAJOR, Chip, PluginRun, bi_v150_chips, start_device_plugin
from harness.pods import (
    SHOW_DEVICES,
    STAY,
    busybox_pod,
    node_resource,
    run_and_read,
    shown_devices,
    wait_pod,
)
from harness.procs import run, wait_until

RESOURCE = "iluvatar.com/gpu"
CHIPS = bi_v150_chips()
BOARDS = {0: CHIPS[0:2], 1: CHIPS[2:4]}


@pytest.fixture
def plugin(cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PluginRun]:
    """`ix-device-plugin run` with default configuration, registered; stopped after the test."""
    started = start_device_plugin(cluster, tmp_path / "plugin", f"device-plugin-{request.node.name[:40]}")
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def wait_resource(cluster: Cluster, capacity: int, allocatable: int, plugin: PluginRun, timeout: float = 60) -> None:
    """Until the Node's capacity and allocatable of iluvatar.com/gpu are as given."""
    wait_until(
        lambda: node_resource(cluster.admin, cluster.node_name, RESOURCE) == (capacity, allocatable),
        timeout,
        f"node {RESOURCE} capacity {capacity}, allocatable {allocatable} "
        f"(now {node_resource(cluster.admin, cluster.node_name, RESOURCE)})",
        [plugin.process.log, cluster.processes["kubelet"].log],
    )


def board_of(env: dict[str, str]) -> int:
    """The board whose chips IX_VISIBLE_DEVICES names."""
    visible = env["IX_VISIBLE_DEVICES"].split(",")
    (board,) = [index for index, chips in BOARDS.items() if sorted(c.uuid for c in chips) == sorted(visible)]
    return board


def expected_nodes(chips: list[Chip]) -> dict[str, str]:
    """What SHOW_DEVICES prints for a container given chips: their nodes and /dev/itrctl, as hex major:minor."""
    nodes = {f"/dev/iluvatar{chip.minor}": f"{DEVICE_MAJOR:x}:{chip.minor:x}" for chip in chips}
    return nodes | {"/dev/itrctl": f"{DEVICE_MAJOR:x}:ff"}


def test_registers_and_advertises_whole_boards_split_boards_and_replicas(cluster: Cluster, plugin: PluginRun) -> None:
    wait_resource(cluster, 2, 2, plugin)
    plugin.set_config({"flags": {"splitboard": True}})
    wait_resource(cluster, 4, 4, plugin)
    plugin.set_config({"sharing": {"timeSlicing": {"replicas": 4}}})
    wait_resource(cluster, 8, 8, plugin)
    plugin.set_config({"flags": {"splitboard": True}, "sharing": {"timeSlicing": {"replicas": 4}}})
    wait_resource(cluster, 16, 16, plugin)
    assert "ix_device_plugin_registered 1.0" in plugin.metrics()


def test_a_pod_asking_for_one_gpu_sees_exactly_its_device_nodes_and_env(
    cluster: Cluster, admin: Kubectl, namespace: str, plugin: PluginRun
) -> None:
    wait_resource(cluster, 2, 2, plugin)
    _, output = run_and_read(admin, namespace, busybox_pod("one-gpu", SHOW_DEVICES + STAY, gpus=1))
    nodes, env = shown_devices(output)
    board = BOARDS[board_of(env)]
    assert nodes == expected_nodes(board)
    assert env["IX_REPLICA_DEVICES"] == board[0].uuid
    assert env["IX_VISIBLE_DEVICES"] == ",".join(chip.uuid for chip in board)
    assert env["ILUVATAR_COREX_VISIBLE_DEVICES"] == env["IX_VISIBLE_DEVICES"]
    wait_resource(cluster, 2, 2, plugin)  # allocatable counts devices, not free ones
    assert admin.get("pod", "one-gpu", namespace)["status"]["containerStatuses"][0]["restartCount"] == 0


def test_a_split_board_chip_and_two_time_sliced_replicas(
    cluster: Cluster, admin: Kubectl, namespace: str, plugin: PluginRun
) -> None:
    plugin.set_config({"flags": {"splitboard": True}, "sharing": {"timeSlicing": {"replicas": 2}}})
    wait_resource(cluster, 8, 8, plugin)
    _, output = run_and_read(admin, namespace, busybox_pod("two-replicas", SHOW_DEVICES + STAY, gpus=2))
    nodes, env = shown_devices(output)
    replicas = env["IX_REPLICA_DEVICES"].split(",")
    assert len(replicas) == 2 and all(re.fullmatch(r"GPU-[0-9a-f-]+::[01]", r) for r in replicas)
    chips = [chip for chip in CHIPS if chip.uuid in env["IX_VISIBLE_DEVICES"].split(",")]
    assert {replica.split("::")[0] for replica in replicas} == {chip.uuid for chip in chips}
    assert nodes == expected_nodes(chips)


def test_with_cdi_cri_containerd_resolves_the_plugins_cdi_spec(
    cluster: Cluster, admin: Kubectl, namespace: str, plugin: PluginRun
) -> None:
    """Allocate names CDI devices only (no device nodes): the nodes in the container come from containerd's CDI."""
    plugin.set_config({"flags": {"deviceListStrategy": ["cdi-cri"]}})
    spec = cluster.cdi_dir / "iluvatar.com-gpu.yaml"
    wait_until(spec.exists, 30, f"{spec} written", [plugin.process.log])
    validated = run([str(cluster.binaries["cdi-validate"]), str(cluster.cdi_dir)]).stdout
    # Each chip's device with the spec-wide /dev/itrctl; `all` has the four chips and itrctl.
    assert all(f"iluvatar.com/gpu={chip.uuid}: 2 device nodes" in validated for chip in CHIPS)
    assert "iluvatar.com/gpu=all: 5 device nodes" in validated
    wait_resource(cluster, 2, 2, plugin)
    wait_until(
        lambda: metric(plugin, "ix_device_plugin_config_reloads_total") >= 1,
        30,
        "config reloaded",
        [plugin.process.log],
    )
    _, output = run_and_read(admin, namespace, busybox_pod("cdi", SHOW_DEVICES + STAY, gpus=1))
    nodes, env = shown_devices(output)
    assert nodes == expected_nodes(BOARDS[board_of(env)])


def test_with_cdi_cri_and_no_spec_containerd_refuses_the_container(
    cluster: Cluster, admin: Kubectl, namespace: str, plugin: PluginRun
) -> None:
    """The negative control: the device names reach containerd, which cannot resolve them without the spec."""
    plugin.set_config({"flags": {"deviceListStrategy": ["cdi-cri"]}})
    spec = cluster.cdi_dir / "iluvatar.com-gpu.yaml"
    wait_until(spec.exists, 30, f"{spec} written", [plugin.process.log])
    wait_resource(cluster, 2, 2, plugin)
    spec.unlink()
    admin.create(busybox_pod("no-spec", SHOW_DEVICES + STAY, gpus=1), "-n", namespace)

    def refused(pod: dict) -> bool:
        waiting = pod.get("status", {}).get("containerStatuses", [{}])[0].get("state", {}).get("waiting", {})
        return waiting.get("reason") == "CreateContainerError" and "CDI" in waiting.get("message", "")

    pod = wait_pod(admin, namespace, "no-spec", refused, "refused for its CDI devices", timeout=90)
    message = pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    assert "unresolvable CDI devices iluvatar.com/gpu=GPU-" in message


def test_the_plugin_registers_again_after_a_kubelet_restart(
    cluster: Cluster, admin: Kubectl, namespace: str, plugin: PluginRun
) -> None:
    wait_resource(cluster, 2, 2, plugin)
    _, before = run_and_read(admin, namespace, busybox_pod("before", SHOW_DEVICES + STAY, gpus=1))
    cluster.stop_kubelet()
    cluster.start_kubelet()
    cluster.wait_node_ready()
    wait_until(
        lambda: metric(plugin, "ix_device_plugin_reregistrations_total") >= 1,
        60,
        "the plugin registered again",
        [plugin.process.log, cluster.processes["kubelet"].log],
    )
    plugin.wait_ready()
    wait_resource(cluster, 2, 2, plugin)
    _, after = run_and_read(admin, namespace, busybox_pod("after", SHOW_DEVICES + STAY, gpus=1))
    assert board_of(shown_devices(after)[1]) != board_of(shown_devices(before)[1])
    status = admin.get("pod", "before", namespace)["status"]
    assert status["phase"] == "Running"
    assert status["containerStatuses"][0]["restartCount"] == 0


def test_an_unhealthy_chip_lowers_allocatable_and_reaches_the_pods_status(
    cluster: Cluster, admin: Kubectl, namespace: str, plugin: PluginRun
) -> None:
    wait_resource(cluster, 2, 2, plugin)
    _, output = run_and_read(admin, namespace, busybox_pod("holder", SHOW_DEVICES + STAY, gpus=1))
    board = BOARDS[board_of(shown_devices(output)[1])]
    broken = [Chip(c.uuid, c.minor, c.board, ("ECC",)) if c == board[1] else c for c in CHIPS]
    plugin.set_chips(broken)
    wait_resource(cluster, 2, 1, plugin)

    def device_health(pod: dict) -> bool:
        statuses = pod["status"]["containerStatuses"][0].get("allocatedResourcesStatus") or []
        found = {r["resourceID"]: r.get("health") for s in statuses if s["name"] == RESOURCE for r in s["resources"]}
        return found == {board[0].uuid: "Unhealthy"}

    wait_pod(admin, namespace, "holder", device_health, "allocatedResourcesStatus Unhealthy", timeout=60)
    plugin.set_chips(CHIPS)
    wait_resource(cluster, 2, 2, plugin)

    def healthy_again(pod: dict) -> bool:
        statuses = pod["status"]["containerStatuses"][0].get("allocatedResourcesStatus") or []
        return [r.get("health") for s in statuses for r in s["resources"]] == ["Healthy"]

    wait_pod(admin, namespace, "holder", healthy_again, "allocatedResourcesStatus Healthy", timeout=60)


def test_telemetry_labels_a_pods_chips_from_the_pod_resources_api(
    cluster: Cluster, admin: Kubectl, namespace: str, plugin: PluginRun
) -> None:
    wait_resource(cluster, 2, 2, plugin)
    _, output = run_and_read(admin, namespace, busybox_pod("metered", SHOW_DEVICES + STAY, gpus=1))
    held = {chip.uuid for chip in BOARDS[board_of(shown_devices(output)[1])]}

    def holders() -> dict[str, tuple[str, str, str]] | None:
        found = {}
        for line in plugin.metrics().splitlines():
            if line.startswith("ix_gpu_temperature{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
                found[labels["uuid"]] = (labels["namespace"], labels["pod"], labels["container"])
        return found if {u for u, where in found.items() if where[1] == "metered"} == held else None

    found = wait_until(holders, 60, "ix_gpu_temperature labelled with the pod", [plugin.process.log])
    assert set(found) == {chip.uuid for chip in CHIPS}
    assert {found[uuid] for uuid in held} == {(namespace, "metered", "main")}
    assert {found[uuid] for uuid in set(found) - held} == {("", "", "")}


def metric(plugin: PluginRun, name: str) -> float:
    """The value of an unlabelled metric of the plugin (0 when absent)."""
    for line in plugin.metrics().splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0
