"""A node moved from the device plugin to the DRA driver and back keeps its labels throughout: the agent that
stops hands the feature file over (retired, not removed) and the one that starts writes its own over it."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

from helpers.dra_support import DraNode
from helpers.support import DaemonFactory
from helpers.waits import until
from prometheus_client.parser import text_string_to_metric_families

from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.dra.driver import DraDriver
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

FEATURES = "ix-device-plugin"
EXPIRY = "# +expiry-time="


def dra_node(short_dir: Path, apiserver: ApiServerStandIn) -> DraNode:
    (short_dir / "node").mkdir()
    return DraNode(short_dir / "node", apiserver)


def read(directory: Path) -> str | None:
    try:
        return (directory / FEATURES).read_text()
    except FileNotFoundError:
        return None


def labels(text: str | None) -> dict[str, str]:
    lines = (text or "").splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def plugin_labels(text: str | None) -> dict[str, str]:
    """The labels both modes write (the DRA driver adds iluvatar.com/dra.*)."""
    return {name: value for name, value in labels(text).items() if not name.startswith("iluvatar.com/dra.")}


@contextlib.asynccontextmanager
async def sampled(directory: Path, every: float = 0.005) -> AsyncIterator[list[str | None]]:
    """The feature file's text, read every few milliseconds while inside (as NFD would find it)."""
    samples: list[str | None] = []

    async def sample() -> None:
        while True:
            samples.append(read(directory))
            await asyncio.sleep(every)

    task = asyncio.create_task(sample())
    try:
        yield samples
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def start_plugin(start_daemon: DaemonFactory, kubelet: KubeletStandIn, node: DraNode, features: Path) -> Daemon:
    daemon = await start_daemon(str(node.devices_file), node_feature_dir=features)
    await kubelet.wait_registered(daemon.plan.resource_name)
    return daemon


async def start_driver(node: DraNode, features: Path) -> DraDriver:
    driver = await node.start(node_feature_dir=features)
    await until(lambda: "iluvatar.com/dra.driver" in labels(read(features)) and not _retired(features))
    return driver


def _retired(features: Path) -> bool:
    return (read(features) or "").startswith(EXPIRY)


async def test_moving_to_dra_and_back_keeps_the_labels_at_every_moment(
    short_dir: Path, apiserver: ApiServerStandIn, kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    node = dra_node(short_dir, apiserver)
    features = short_dir / "features.d"
    try:
        daemon = await start_plugin(start_daemon, kubelet, node, features)
        expected = plugin_labels(read(features))
        assert expected["iluvatar.com/gpu.present"] == "true"
        async with sampled(features) as samples:
            await daemon.shutdown()  # the plugin's pod leaves the node first ...
            await asyncio.sleep(0.2)
            driver = await start_driver(node, features)  # ... and the driver's starts after it
            await node.stop(driver)  # moved back
            await asyncio.sleep(0.2)
            await start_plugin(start_daemon, kubelet, node, features)
            await until(lambda: not _retired(features) and "iluvatar.com/dra.driver" not in labels(read(features)))
        assert len(samples) > 50
        assert all(plugin_labels(text) == expected for text in samples), "a moment without the node's labels"
        assert any("iluvatar.com/dra.driver" in labels(text) for text in samples)
    finally:
        await node.stop_all()


async def test_an_agent_stopping_after_the_next_one_started_leaves_the_next_ones_labels(
    short_dir: Path, apiserver: ApiServerStandIn, kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    """The driver starts while the plugin still runs (the kubelet's order is not fixed): the plugin's stop leaves
    the driver's file; and when the plugin wrote last before stopping, the driver writes its own again at once."""
    node = dra_node(short_dir, apiserver)
    features = short_dir / "features.d"
    try:
        daemon = await start_plugin(start_daemon, kubelet, node, features)
        await start_driver(node, features)
        node_labels = daemon.node.labels
        assert node_labels is not None
        node_labels.apply(daemon.node_labels(node_labels.machine))  # the plugin writes last (a health change, say)
        assert "iluvatar.com/dra.driver" not in labels(read(features))
        async with sampled(features) as samples:
            await daemon.shutdown()
            await until(lambda: "iluvatar.com/dra.driver" in labels(read(features)) and not _retired(features), 3)
        assert all(plugin_labels(text) == plugin_labels(samples[0]) for text in samples)
    finally:
        await node.stop_all()


async def test_a_file_removed_by_an_older_agent_at_its_stop_is_written_again_at_once(
    short_dir: Path, apiserver: ApiServerStandIn
) -> None:
    node = dra_node(short_dir, apiserver)
    features = short_dir / "features.d"
    try:
        await start_driver(node, features)
        before = read(features)
        (features / FEATURES).unlink()  # what an agent before this version did at a clean stop
        await until(lambda: read(features) == before, timeout=1)  # inotify: well before NFD's next pass
    finally:
        await node.stop_all()


async def test_a_driver_alone_keeps_its_labels_for_the_next_agent_when_it_stops(
    short_dir: Path, apiserver: ApiServerStandIn
) -> None:
    node = dra_node(short_dir, apiserver)
    features = short_dir / "features.d"
    driver = await start_driver(node, features)
    written = labels(read(features))
    await node.stop(driver)
    text = read(features)
    assert text is not None and text.startswith(EXPIRY) and labels(text) == written


async def test_a_free_chips_series_are_the_same_series_in_both_modes(
    short_dir: Path, apiserver: ApiServerStandIn, kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    """Prometheus takes an empty label for no label: a free chip's series has the same identity from either agent,
    so its graphs go on across the move."""
    node = dra_node(short_dir, apiserver)
    try:
        daemon = await start_daemon(
            str(node.devices_file), health_address="127.0.0.1:0", telemetry_interval=0.05, node_name=node.node
        )
        await kubelet.wait_registered(daemon.plan.resource_name)
        await until(lambda: bool(daemon.node.telemetry and daemon.node.telemetry.samples))
        plugin = await series(daemon.node.probe_port)
        driver = await node.start(health_address="127.0.0.1:0", telemetry_interval=0.05)
        assert driver.node.telemetry is not None
        await until(lambda: bool(driver.node.telemetry and driver.node.telemetry.samples))
        assert driver.node.probe_port is not None
        assert await series(driver.node.probe_port) == plugin
        assert len(plugin) == 4 * 15  # every chip, every metric
    finally:
        await node.stop_all()


async def series(port: int) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """The ix_* series on /metrics as Prometheus identifies them (empty labels dropped)."""

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()

    return {
        (sample.name, frozenset((k, v) for k, v in sample.labels.items() if v))
        for family in text_string_to_metric_families(await asyncio.to_thread(scrape))
        if family.name.startswith("ix_") and not family.name.startswith("ix_device_plugin")
        for sample in family.samples
    }
