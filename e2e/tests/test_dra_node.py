"""A DRA node needs no other Iluvatar daemon: the DRA driver (a host process, with the chart's RBAC) writes the
node's labels and exports the GPU metrics with the pods and claims holding each chip, and a node moved from the
device plugin to DRA and back keeps its labels throughout.

Node labels reach the real Node object through a model of NFD's local feature source (harness/nfd.py; NFD itself
is not built into this cluster): what the agents write to `features.d` is what the Node carries.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.dra import DRIVER, Driver, chips_seen, claim
from harness.kube import Kubectl
from harness.nfd import NfdLocalSource
from harness.plugin import PluginRun, start_device_plugin
from harness.pods import SHOW_DEVICES, STAY, busybox_pod, run_and_read
from harness.waits import until

DRA_LABEL = "iluvatar.com/gpu.dra"
PREFIX = "iluvatar.com/"


def gpu_labels(admin: Kubectl, node: str) -> dict[str, str]:
    """The Node's labels in our namespace but the DRA switch label (the operator's, not an agent's)."""
    labels = admin.get("node", node)["metadata"].get("labels", {})
    return {name: value for name, value in labels.items() if name.startswith(PREFIX) and name != DRA_LABEL}


def plugin_labels(labels: dict[str, str]) -> dict[str, str]:
    """The labels both modes write (the DRA driver adds iluvatar.com/dra.*)."""
    return {name: value for name, value in labels.items() if not name.startswith("iluvatar.com/dra.")}


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The node's NFD feature directory, shared by whichever agent runs."""
    return tmp_path_factory.mktemp("features.d")


@pytest.fixture(scope="module")
def nfd(cluster: Cluster, features: Path) -> Iterator[NfdLocalSource]:
    """NFD on the node: the feature files become the Node's labels; removed after the module."""
    source = NfdLocalSource(cluster.admin, cluster.node_name, features).start()
    try:
        yield source
    finally:
        source.stop()


@pytest.fixture(scope="module")
def node_driver(
    cluster: Cluster, driver_kubeconfig: Path, features: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Driver]:
    """The DRA driver (not started) writing to the shared feature directory; stopped after the module."""
    driver = Driver(cluster, tmp_path_factory.mktemp("dra-node"), driver_kubeconfig)
    driver.features = features
    try:
        yield driver
    finally:
        driver.stop()
        cluster.admin(
            "delete", "resourceslice", "-l", "app.kubernetes.io/managed-by=ix-device-plugin", "--ignore-not-found"
        )


def scrape_holders(run: PluginRun) -> dict[str, list[dict[str, str]]]:
    """ix_gpu_temperature's label sets on the agent's /metrics, by chip UUID."""
    found: dict[str, list[dict[str, str]]] = {}
    for line in run.metrics().splitlines():
        if line.startswith("ix_gpu_temperature{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            found.setdefault(labels["uuid"], []).append(labels)
    return found


def test_a_dra_node_has_the_node_labels(
    cluster: Cluster, admin: Kubectl, nfd: NfdLocalSource, node_driver: Driver
) -> None:
    run = node_driver.start()
    labels = until(
        lambda: (found := gpu_labels(admin, cluster.node_name)).get("iluvatar.com/dra.driver") and found,
        30,
        "the DRA driver's labels on the Node",
        [run.process.log],
    )
    assert labels["iluvatar.com/gpu.present"] == "true"
    assert labels["iluvatar.com/gpu.product"] == "BI-V150"
    assert labels["iluvatar.com/gpu.count"] == "4" and labels["iluvatar.com/gpu.boards"] == "2"
    assert labels["iluvatar.com/gpu.memory"] == "32768"
    assert labels["iluvatar.com/gpu.sharing-strategy"] == "none"
    assert labels["iluvatar.com/dra.driver"] == DRIVER
    assert (labels["iluvatar.com/dra.chips"], labels["iluvatar.com/dra.boards"]) == ("4", "2")
    assert "iluvatar.com/dra.shares" not in labels  # no sharing.timeSlicing.replicas on this node


def test_a_pod_with_a_claim_appears_in_the_metrics_with_its_pod_and_claim(
    cluster: Cluster, admin: Kubectl, namespace: str, dra_objects: list, node_driver: Driver
) -> None:
    run = node_driver.run if node_driver.run and node_driver.run.process.running() else node_driver.start()
    admin.create(claim("metered"), "-n", namespace)
    pod = busybox_pod("metered", SHOW_DEVICES + STAY, claims=[{"name": "gpu", "resourceClaimName": "metered"}])
    _, output = run_and_read(admin, namespace, pod)
    (chip,) = chips_seen(output)

    def labelled() -> dict[str, list[dict[str, str]]] | None:
        found = scrape_holders(run)
        return found if any(s["pod"] == "metered" for s in found.get(chip.uuid, [])) else None

    found = until(labelled, 60, "ix_gpu_temperature labelled with the pod and its claim", [run.process.log])
    (series,) = found[chip.uuid]
    assert (series["namespace"], series["pod"], series["container"]) == (namespace, "metered", "main")
    assert (series["claim_namespace"], series["claim_name"], series["share_id"]) == (namespace, "metered", "")
    assert series["node_name"] == cluster.node_name and series["name"] == "Iluvatar BI-V150"
    others = [s for uuid, labelled_series in found.items() if uuid != chip.uuid for s in labelled_series]
    assert len(others) == 3 and {(s["pod"], s["claim_name"]) for s in others} == {("", "")}
    admin.delete("pod", "metered", namespace)


def test_a_node_moved_from_the_device_plugin_to_dra_and_back_keeps_its_labels_throughout(
    cluster: Cluster, admin: Kubectl, nfd: NfdLocalSource, node_driver: Driver, features: Path, tmp_path: Path
) -> None:
    """The Node's labels, sampled every second while the operator labels the node for DRA, the device plugin's
    pod stops, the driver's starts, and the same back: the labels both modes write are there at every sample."""
    node_driver.stop()
    plugin = start_device_plugin(cluster, tmp_path / "plugin", "device-plugin-moving", features=features)
    try:
        plugin.wait_ready()
        before = until(
            lambda: (
                (found := gpu_labels(admin, cluster.node_name)).get("iluvatar.com/gpu.present")
                and "iluvatar.com/dra.driver" not in found
                and found
            ),
            30,
            "the device plugin's labels on the Node",
            [plugin.process.log],
        )
        samples: list[dict[str, str]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(1.0):
                samples.append(gpu_labels(admin, cluster.node_name))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            admin("label", "node", cluster.node_name, f"{DRA_LABEL}=true", "--overwrite")
            plugin.stop()  # the device plugin's pod leaves the node (its affinity refuses the label) ...
            time.sleep(3)  # ... and the driver's pod is created and started a moment later
            run = node_driver.start()
            until(
                lambda: gpu_labels(admin, cluster.node_name).get("iluvatar.com/dra.driver"),
                30,
                "the DRA driver's labels on the Node",
                [run.process.log],
            )
            time.sleep(2)
            admin("label", "node", cluster.node_name, f"{DRA_LABEL}-")  # and back
            node_driver.stop()
            time.sleep(3)
            plugin = start_device_plugin(cluster, tmp_path / "plugin", "device-plugin-back", features=features)
            plugin.wait_ready()
            until(
                lambda: "iluvatar.com/dra.driver" not in gpu_labels(admin, cluster.node_name),
                30,
                "the device plugin's labels alone on the Node again",
                [plugin.process.log],
            )
            time.sleep(2)
        finally:
            stop.set()
            sampler.join(10)
            admin("label", "node", cluster.node_name, f"{DRA_LABEL}-")
        assert len(samples) >= 10
        missing = [i for i, labels in enumerate(samples) if plugin_labels(labels) != plugin_labels(before)]
        assert not missing, f"samples {missing} of {len(samples)} lack the node's labels: {samples[missing[0]]}"
        assert any("iluvatar.com/dra.driver" in labels for labels in samples)  # the driver's own, while it ran
        assert nfd.errors == []
    finally:
        plugin.stop()
