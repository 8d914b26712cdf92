"""The node services on a DRA node: the device plugin's node labels and the DRA driver's own, kept true."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.dra_support import NODE, DraNode, gpu_config
from helpers.reset_support import Watched
from helpers.support import RESOURCE, DaemonFactory, config_flags
from helpers.waits import until
from prometheus_client.parser import text_string_to_metric_families

from ix_device_plugin.dra.driver import DraDriver
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import ClaimResource, PodClaim, PodResourcesStandIn
from ix_device_plugin.telemetry.collector import CLAIM_LABELS, LABELS

FEATURES = "ix-device-plugin"
DRA_LABELS = {"iluvatar.com/dra.driver", "iluvatar.com/dra.chips", "iluvatar.com/dra.boards", "iluvatar.com/dra.shares"}


def labels(directory: Path) -> dict[str, str]:
    """The labels of the feature file in directory, as NFD reads them ({} without a file)."""
    path = directory / FEATURES
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def machine(root: Path) -> Path:
    """A sysfs root whose DMI product name is X580-G30."""
    dmi = root / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "product_name").write_text("X580-G30\n")
    return root


@pytest.mark.parametrize(
    ("flags", "dra"),
    [
        ({}, {"iluvatar.com/dra.chips": "4", "iluvatar.com/dra.boards": "2"}),
        (
            {"splitboard": True, "replicas": "4"},
            {"iluvatar.com/dra.chips": "4", "iluvatar.com/dra.boards": "0", "iluvatar.com/dra.shares": "4"},
        ),
        (
            {"replicas": "2"},
            {"iluvatar.com/dra.chips": "0", "iluvatar.com/dra.boards": "2", "iluvatar.com/dra.shares": "2"},
        ),
    ],
)
async def test_a_dra_node_has_the_device_plugins_labels_and_its_own(
    node: DraNode,
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    short_dir: Path,
    flags: dict[str, str | bool],
    dra: dict[str, str],
) -> None:
    """The same feature file as the device plugin writes for the same node and ix-config, plus the DRA facts."""
    sysfs = machine(short_dir / "sys")
    plugin_dir, driver_dir = short_dir / "plugin-features", short_dir / "driver-features"
    given = config_flags(**flags)
    # the plugin as on a node of its own: on one node the agent that started second would wait on standby, and only
    # the pod acting for the node writes its labels
    alone = short_dir / "plugin-plugins"
    daemon = await start_daemon(
        str(node.devices_file), node_feature_dir=plugin_dir, sysfs_root=sysfs, given=given,
        kubelet_plugins_directory_path=alone,
    )  # fmt: skip
    await kubelet.wait_registered(daemon.plan.resource_name)
    config = Config(splitboard=bool(flags.get("splitboard", False)), replicas=int(flags.get("replicas", 0)))
    await node.start(node_feature_dir=driver_dir, sysfs_root=sysfs, config=config)
    await until(lambda: bool(labels(driver_dir)))
    written = labels(driver_dir)
    assert {name: value for name, value in written.items() if name not in DRA_LABELS} == labels(plugin_dir)
    assert {name: value for name, value in written.items() if name in DRA_LABELS} == {
        "iluvatar.com/dra.driver": "gpu.iluvatar.com",
        **dra,
    }
    assert written["iluvatar.com/gpu.product"] == "BI-V150" and written["iluvatar.com/gpu.machine"] == "X580-G30"


async def test_the_labels_follow_health_and_hot_plug(node: DraNode, short_dir: Path) -> None:
    features = short_dir / "features.d"
    await node.start(node_feature_dir=features)
    await until(lambda: labels(features).get("iluvatar.com/gpu.healthy") == "2")
    node.write_boards([{"product": "BI-V150", "chips": [{"health": ["ECC"]}, {}]}, {"product": "BI-V150"}])
    await until(lambda: labels(features)["iluvatar.com/gpu.healthy"] == "1", timeout=3)
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150"}, {"product": "BI-V100"}])
    await until(lambda: labels(features)["iluvatar.com/gpu.boards"] == "3", timeout=3)
    assert labels(features)["iluvatar.com/dra.boards"] == "3"  # the BI-V100 is a whole board and a chip
    assert labels(features)["iluvatar.com/dra.chips"] == "5"


async def test_an_unwritable_feature_dir_is_said_once_and_retried(
    node: DraNode, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="ix_device_plugin.nodelabels")
    blocked = short_dir / "features.d"
    blocked.write_text("a file where the directory should be")
    driver = await node.start(node_feature_dir=blocked)
    await node.wait_slice(lambda devices: len(devices) == 6)  # serving does not depend on the labels
    await until(lambda: any("node labels not written" in r.getMessage() for r in caplog.records))
    blocked.unlink()
    await until(lambda: (blocked / FEATURES).exists(), timeout=8)
    assert len([r for r in caplog.records if "node labels not written" in r.getMessage()]) == 1
    assert driver.service.down() == []


async def test_no_chips_no_labels(node: DraNode, short_dir: Path) -> None:
    features = short_dir / "features.d"
    features.mkdir()
    (features / FEATURES).write_text("iluvatar.com/gpu.present=true\n")  # left by an earlier agent
    node.write_boards([])
    await node.start(node_feature_dir=features, config=Config(fail_on_init_error=False))
    await until(lambda: not (features / FEATURES).exists())


# ---- GPU metrics with the pods and claims holding each chip ---------------------------------------------------


def scrape(port: int) -> list[dict[str, str]]:
    """The label sets of ix_gpu_temperature on the driver's /metrics, over real HTTP."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    family = families.get("ix_gpu_temperature")
    return [] if family is None else [dict(sample.labels) for sample in family.samples]


def holders_of(series: list[dict[str, str]], device: str, driver: DraDriver) -> set[tuple[str, ...]]:
    """(namespace, pod, container, claim namespace, claim name, share ID) of every series of the device's chips."""
    chips = {chip.uuid for chip in driver.content.by_name()[device].chips}
    names = ("namespace", "pod", "container", "claim_namespace", "claim_name", "share_id")
    return {tuple(s[name] for name in names) for s in series if s["uuid"] in chips}


async def series_where(driver: DraDriver, predicate: Callable[[list[dict[str, str]]], bool]) -> list[dict[str, str]]:
    async def matching() -> list[dict[str, str]] | None:
        series = await asyncio.to_thread(scrape, driver.node.probe_port)
        return series if predicate(series) else None

    return await until(matching, timeout=5, interval=0.05, message="metrics series matching the predicate")


def claim(name: str, *devices: str, shares: tuple[str, ...] = ()) -> PodClaim:
    """A claim of devices on node-a's pool, as the kubelet keeps it (shares: each device's share ID)."""
    share_ids = shares or (None,) * len(devices)
    resources = (
        ClaimResource(DRIVER, NODE, device, (f"{DRIVER}/claim={name}-{device}",), share)
        for device, share in zip(devices, share_ids, strict=True)
    )
    return PodClaim(name, tuple(resources))


async def test_each_chip_shows_the_pods_and_claims_holding_it(
    node: DraNode, pod_resources: PodResourcesStandIn
) -> None:
    """A board claim labels both chips; a chip held by a workload and an admin-access claim shows both; a
    container's claim of another driver shows nothing; a free chip has one series with empty holder labels."""
    driver = await node.start(
        health_address="127.0.0.1:0", telemetry_interval=0.05, pod_resources_socket=pod_resources.socket_path
    )
    other = PodClaim("nic", (ClaimResource("nic.example.com", NODE, "gpu-3"),))
    pod_resources.claims = {
        ("ml", "trainer-0"): {"main": [claim("train", "board-0")], "sidecar": []},
        ("ml", "infer-0"): {"main": [claim("infer", "gpu-2"), other]},
        ("monitoring", "watch-0"): {"probe": [claim("watch", "gpu-2")]},  # adminAccess: the kubelet says the same
    }
    series = await series_where(driver, lambda s: any(x["pod"] == "watch-0" for x in s))
    assert holders_of(series, "board-0", driver) == {("ml", "trainer-0", "main", "ml", "train", "")}
    assert len([s for s in series if s["pod"] == "trainer-0"]) == 2  # both chips of the board
    assert holders_of(series, "gpu-2", driver) == {
        ("ml", "infer-0", "main", "ml", "infer", ""),
        ("monitoring", "watch-0", "probe", "monitoring", "watch", ""),
    }
    assert holders_of(series, "gpu-3", driver) == {("", "", "", "", "", "")}
    gpu_3 = next(s for s in series if s["uuid"] == driver.content.by_name()["gpu-3"].chip.uuid)
    assert set(gpu_3) == {*LABELS, *CLAIM_LABELS}
    assert gpu_3["node_name"] == NODE and gpu_3["name"] == "Iluvatar BI-V150" and gpu_3["gpu"] == "3"

    pod_resources.claims = {}  # the pods ended
    series = await series_where(driver, lambda s: all(x["pod"] == "" for x in s))
    assert len(series) == 4


async def test_shares_of_one_chip_are_a_series_each(node: DraNode, pod_resources: PodResourcesStandIn) -> None:
    driver = await node.start(
        health_address="127.0.0.1:0",
        telemetry_interval=0.05,
        pod_resources_socket=pod_resources.socket_path,
        config=Config(splitboard=True, replicas=4),
    )
    first, second = "6a3b1a4e-0000-4000-8000-000000000001", "6a3b1a4e-0000-4000-8000-000000000002"
    pod_resources.claims = {
        ("team-a", "job-a"): {"main": [claim("a", "gpu-1", shares=(first,))]},
        ("team-b", "job-b"): {"main": [claim("b", "gpu-1", shares=(second,))]},
    }
    series = await series_where(driver, lambda s: any(x["pod"] == "job-b" for x in s))
    assert holders_of(series, "gpu-1", driver) == {
        ("team-a", "job-a", "main", "team-a", "a", first),
        ("team-b", "job-b", "main", "team-b", "b", second),
    }


async def test_a_pod_the_device_plugin_gave_a_board_keeps_its_labels_on_a_dra_node(
    node: DraNode, pod_resources: PodResourcesStandIn
) -> None:
    """After a move to DRA without a drain, the kubelet still reports the plugin's device IDs: the pod keeps its
    series (the node planned as the plugin plans it: a whole board per device without flags.splitboard)."""
    driver = await node.start(
        health_address="127.0.0.1:0", telemetry_interval=0.05, pod_resources_socket=pod_resources.socket_path
    )
    board = driver.inventory.boards[1]
    pod_resources.pods = {("ml", "legacy-0"): {"main": {RESOURCE: [board.uuid]}}}
    series = await series_where(driver, lambda s: any(x["pod"] == "legacy-0" for x in s))
    held = {s["uuid"] for s in series if s["pod"] == "legacy-0"}
    assert held == {chip.uuid for chip in board.chips}
    assert {s["claim_name"] for s in series} == {""}


async def test_the_dra_driver_exports_the_node_state_the_dashboard_reads(node: DraNode) -> None:
    driver = await node.start(health_address="127.0.0.1:0")  # telemetry off
    node.write_boards([{"product": "BI-V150", "chips": [{}, {"health": ["ECC"]}]}, {"product": "BI-V150"}])
    await node.wait_slice(lambda devices: "taints" in devices.get("gpu-1", {}))

    def values() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{driver.node.probe_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }

    found = await asyncio.to_thread(values)
    assert found[("ix_device_plugin_devices", (("health", "Healthy"), ("resource", DRIVER)))] == 4
    assert found[("ix_device_plugin_devices", (("health", "Unhealthy"), ("resource", DRIVER)))] == 2  # gpu-1, board-0
    assert found[("ix_device_plugin_chips", (("state", "present"),))] == 4
    assert found[("ix_device_plugin_chip_health_errors", (("error", "ECC"),))] == 1
    assert found[("ix_device_plugin_registered", ())] == 0  # no kubelet has registered it
    assert not any(name.startswith("ix_gpu_") for name, _ in found)  # telemetry is off


async def test_telemetry_lets_go_of_the_library_while_a_claims_chips_are_reset(node: DraNode) -> None:
    backend = Watched(node.devices_file, reset_seconds=0.3)
    driver = await node.start(backend_factory=lambda: backend, telemetry_interval=0.05, reset_timeout=5.0)
    await until(lambda: "sample" in backend.events)
    kubelet = await node.kubelet(driver)
    claim = node.claim("fresh", ["gpu-0"], config=[gpu_config(reset=True)])
    assert (await kubelet.prepare([claim])).claims[claim[2]].error == ""
    await until(lambda: backend.events[-1] == "sample")  # passes again after the reset
    begins, ends = backend.events.index("reset begins"), backend.events.index("reset ends")
    assert backend.events[begins - 1] == "close", backend.events  # telemetry released the library first
    assert "sample" not in backend.events[begins:ends], "a telemetry pass ran during the reset"
    await kubelet.close()
