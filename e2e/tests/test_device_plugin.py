"""The device plugin (`ix-device-plugin run`, a host process over simulated chips) with the real kubelet's
device manager, containerd and the pod-resources API.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.kube import Kubectl
from harness.plugin import (
    Chip,
    PluginRun,
    bi_v150_chips,
    expected_nodes,
    fake_ixsmi,
    ixsmi_calls,
    node_events,
    node_health,
    start_device_plugin,
)
from harness.pods import (
    SHOW_DEVICES,
    STAY,
    busybox_pod,
    node_resource,
    run_and_read,
    shown_devices,
    wait_pod,
)
from harness.procs import run
from harness.waits import stays, until

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


def wait_resource(
    cluster: Cluster, capacity: int, allocatable: int, plugin: PluginRun, timeout: float = 60, resource: str = RESOURCE
) -> None:
    """Until the Node's capacity and allocatable of resource (iluvatar.com/gpu) are as given."""
    until(
        lambda: node_resource(cluster.admin, cluster.node_name, resource) == (capacity, allocatable),
        timeout,
        f"node {resource} capacity {capacity}, allocatable {allocatable} "
        f"(now {node_resource(cluster.admin, cluster.node_name, resource)})",
        [plugin.process.log, cluster.processes["kubelet"].log],
    )


def board_of(env: dict[str, str]) -> int:
    """The board whose chips IX_VISIBLE_DEVICES names."""
    visible = env["IX_VISIBLE_DEVICES"].split(",")
    (board,) = [index for index, chips in BOARDS.items() if sorted(c.uuid for c in chips) == sorted(visible)]
    return board


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
    until(spec.exists, 30, f"{spec} written", [plugin.process.log])
    validated = run([str(cluster.binaries["cdi-validate"]), str(cluster.cdi_dir)]).stdout
    # Each chip's device with the spec-wide /dev/itrctl; `all` has the four chips and itrctl.
    assert all(f"iluvatar.com/gpu={chip.uuid}: 2 device nodes" in validated for chip in CHIPS)
    assert "iluvatar.com/gpu=all: 5 device nodes" in validated
    wait_resource(cluster, 2, 2, plugin)
    until(
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
    until(spec.exists, 30, f"{spec} written", [plugin.process.log])
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
    until(
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

    found = until(holders, 60, "ix_gpu_temperature labelled with the pod", [plugin.process.log])
    assert set(found) == {chip.uuid for chip in CHIPS}
    assert {found[uuid] for uuid in held} == {(namespace, "metered", "main")}
    assert {found[uuid] for uuid in set(found) - held} == {("", "", "")}


def metric(plugin: PluginRun, name: str) -> float:
    """The value of an unlabelled metric of the plugin (0 when absent)."""
    return plugin.metric(name) or 0.0


# ------------------------------------------------------------------ self-healing

SHARED = f"{RESOURCE}.shared"
RETURN_ANNOTATION = "iluvatar.com/gpu.return"
HELD_FOR = 5.0  # seconds a held chip is watched past the healer's settle (1 s) and its looks (one a second)


@pytest.fixture
def healing_node(cluster: Cluster, admin: Kubectl) -> Iterator[None]:
    """The Node without the operator's annotation before and after; the reset handshake's ConfigMap removed after."""
    admin("annotate", "node", cluster.node_name, f"{RETURN_ANNOTATION}-")
    try:
        yield
    finally:
        admin("annotate", "node", cluster.node_name, f"{RETURN_ANNOTATION}-")
        admin.delete("configmap", f"ix-gpu-reset-{cluster.node_name}", "kube-system", wait=False)


def healing_plugin(
    cluster: Cluster,
    workdir: Path,
    name: str,
    ixsmi: Path,
    plugins_dir: Path | None = None,
    chips: list[Chip] | None = None,
) -> PluginRun:
    """`ix-device-plugin run` healing as the chart runs it, with API access (the handshake, Node Events, the
    operator's annotation), resetting through a fake ixsmi, its node-health record under plugins_dir; registered."""
    api = ["--kubeconfig", str(cluster.kubeconfig("admin")), "--ixsmi-path", str(ixsmi)]
    started = start_device_plugin(cluster, workdir, name, chips=chips, extra=api, plugins_dir=plugins_dir)
    started.wait_ready()
    return started


def test_a_chip_held_under_a_resource_name_no_longer_served_is_reset_only_once_its_pod_is_gone(
    cluster: Cluster, admin: Kubectl, namespace: str, tmp_path: Path, healing_node: None
) -> None:
    """A pod holds a board under iluvatar.com/gpu; the config is changed live to 2 replicas advertised as
    iluvatar.com/gpu.shared (renameByDefault), so the pod holds none of the devices served now. An XID 48 on the
    board's second chip takes the board's replicas out and nothing is reset while the pod exists (pod-resources
    lists its board under the old name); once it is deleted the chip is reset and back in service."""
    ixsmi = fake_ixsmi(tmp_path / "ixsmi")
    plugin = healing_plugin(cluster, tmp_path / "plugin", "device-plugin-renamed-healing", ixsmi)
    try:
        wait_resource(cluster, 2, 2, plugin)
        _, output = run_and_read(admin, namespace, busybox_pod("holder", SHOW_DEVICES + STAY, gpus=1))
        board = BOARDS[board_of(shown_devices(output)[1])]
        plugin.set_config({"sharing": {"timeSlicing": {"replicas": 2, "renameByDefault": True}}})
        wait_resource(cluster, 4, 4, plugin, resource=SHARED)
        broken = board[1]  # named by no device ID: the pod holds it through its board's
        plugin.set_chips([replace(chip, xids=(48,)) if chip == broken else chip for chip in CHIPS])
        wait_resource(cluster, 4, 2, plugin, resource=SHARED)
        waiting = f"({broken.uuid}) waits to be reset: held by {namespace}/holder (main)"
        until(
            lambda: any(waiting in e["message"] for e in node_events(admin, cluster.node_name)),
            30,
            "the chip waits for the pod",
            [plugin.process.log],
        )
        stays(
            lambda: ixsmi_calls(ixsmi) == [] and admin.get("pod", "holder", namespace)["status"]["phase"] == "Running",
            HELD_FOR,
            "no reset while the pod runs and holds the board",
            [plugin.process.log],
        )
        admin.delete("pod", "holder", namespace)
        wait_resource(cluster, 4, 4, plugin, resource=SHARED)
        assert ixsmi_calls(ixsmi) == [f"-r -i {broken.uuid}"]
        assert plugin.metric("ix_device_plugin_healing_outcomes_total", outcome="healed") == 1.0
    finally:
        plugin.stop()


def test_a_chip_that_needs_an_operator_stays_out_across_a_restart_until_an_operator_returns_it(
    cluster: Cluster, admin: Kubectl, tmp_path: Path, healing_node: None
) -> None:
    """An XID 64 (policy operator) takes a board out and the node-health record says its chip needs an operator.
    The plugin is restarted over chips that report nothing any more: from its registration on the board is
    Unhealthy (allocatable never back to 2), nothing is reset, and the record still says operator. The operator's
    `kubectl annotate node ... iluvatar.com/gpu.return=<uuid>` brings it back after one reset."""
    ixsmi = fake_ixsmi(tmp_path / "ixsmi")
    plugins_dir = tmp_path / "kubelet-plugins"  # where the record lives: this scenario's own
    plugins_dir.mkdir()
    broken = CHIPS[3]

    def recorded() -> dict:
        return node_health(plugins_dir).get("chips", {}).get(broken.uuid, {})

    first = healing_plugin(cluster, tmp_path / "plugin", "device-plugin-operator-1", ixsmi, plugins_dir)
    try:
        wait_resource(cluster, 2, 2, first)
        first.set_chips([replace(chip, xids=(64,)) if chip == broken else chip for chip in CHIPS])
        wait_resource(cluster, 2, 1, first)
        until(lambda: recorded().get("phase") == "operator", 30, "the record says operator", [first.process.log])
    finally:
        first.stop()
    second = healing_plugin(cluster, tmp_path / "plugin", "device-plugin-operator-2", ixsmi, plugins_dir, CHIPS)
    try:
        assert second.metric("ix_device_plugin_devices", resource=RESOURCE, health="Healthy") == 1.0
        samples: list[tuple[int, int]] = []

        def allocatable() -> tuple[int, int]:
            samples.append(node_resource(admin, cluster.node_name, RESOURCE))
            return samples[-1]

        until(lambda: allocatable() == (2, 1), 60, "allocatable 1 after the restart", [second.process.log])
        stays(lambda: allocatable() == (2, 1), HELD_FOR, "allocatable still 1", [second.process.log], interval=0.3)
        assert (2, 2) not in samples, samples
        assert ixsmi_calls(ixsmi) == []
        assert recorded()["phase"] == "operator" and recorded()["xids"] == [64], recorded()
        admin("annotate", "--overwrite", "node", cluster.node_name, f"{RETURN_ANNOTATION}={broken.uuid}")
        wait_resource(cluster, 2, 2, second)
        assert ixsmi_calls(ixsmi) == [f"-r -i {broken.uuid}"]
        assert recorded() == {}
    finally:
        second.stop()
