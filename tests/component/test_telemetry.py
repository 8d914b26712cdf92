"""GPU telemetry: IXML calls present, missing, failing and hung; the exposition; pod attribution end to end."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers.support import IXML_DOUBLE_CONFIG as CONFIG_ENV
from helpers.support import NO_NODE_FILES, RESOURCE, DaemonFactory, config_flags, make_dev_root, stop_process
from helpers.waits import stays, until_sync
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ix_device_plugin.api import HEALTHY
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.telemetry import ChipSample, Holder, PodRef
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.hardware.ixml import IxmlBackend
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn
from ix_device_plugin.telemetry.collector import METRIC_NAMES, TelemetryCollector

TELEMETRY_DEVICES = """
driver=4.1.0
device uuid=GPU-b0-c0 name="Iluvatar BI-V150" minor=0 memory=32768 board=B0 position=0 temp=41 fan=35 power=70000 board_power=150000 sm_clock=1500 mem_clock=1600 gpu_util=87 mem_util=40 mem_used=2048 pcie_tx=1200 pcie_rx=3400 ecc_sbe=0 ecc_dbe=2
device uuid=GPU-b0-c1 name="Iluvatar BI-V150" minor=1 memory=32768 board=B0 position=1 temp=44 power=71000 board_power=150000 {extra}
"""  # noqa: E501


def scrape(port: int) -> dict[tuple[str, str], tuple[dict[str, str], float]]:
    """(metric, uuid) -> (labels, value) for the ix_ metrics on /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("ix_") and "uuid" in sample.labels:
                series[(sample.name, sample.labels["uuid"])] = (sample.labels, sample.value)
    return series


@pytest.fixture
def ixml(libs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """ixml(devices, variant) -> an IXML backend over the C double listing devices; closed after the test."""
    made: list[IxmlBackend] = []
    root = make_dev_root(tmp_path / "root", [0, 1])

    def build(devices: str, variant: str = "full") -> IxmlBackend:
        path = tmp_path / "ixml_double.conf"
        path.write_text(devices)
        monkeypatch.setenv(CONFIG_ENV, str(path))
        backend = IxmlBackend(str(libs[variant]), dev_root=root, sysfs_root=tmp_path / "no-sysfs")
        made.append(backend)
        return backend

    yield build
    for backend in made:
        backend.close()


@pytest.fixture
def telemetry_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="ix_device_plugin")
    return caplog


def telemetry_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.getMessage().startswith("telemetry:")]


# ---- the IXML binding against the C double ------------------------------------------------


def test_every_figure_comes_from_its_call(ixml) -> None:  # type: ignore[no-untyped-def]
    backend = ixml(TELEMETRY_DEVICES.format(extra=""))
    samples = backend.sample(backend.discover())
    first = samples["GPU-b0-c0"]
    assert first == ChipSample(
        temperature_c=41,
        fan_speed=35,
        power_w=150.0,  # a chip on a multi-chip board reports its board's power, as ix-exporter does
        sm_clock_mhz=1500,
        mem_clock_mhz=1600,
        gpu_utilization=87,
        mem_utilization=40,
        mem_total_mib=32768,
        mem_used_mib=2048,
        mem_free_mib=30720,
        pcie_tx_kbps=1200,
        pcie_rx_kbps=3400,
        ecc_sbe_volatile=0.0,
        ecc_dbe_volatile=1.0,
    )
    assert samples["GPU-b0-c1"].temperature_c == 44


def test_a_library_without_the_calls_leaves_every_figure_out_and_says_so_once(
    ixml,  # type: ignore[no-untyped-def]
    telemetry_log: pytest.LogCaptureFixture,
) -> None:
    backend = ixml(TELEMETRY_DEVICES.format(extra=""), "no_telemetry")
    inventory = backend.discover()
    for _ in range(3):
        samples = backend.sample(inventory)
    only_memory = ChipSample(mem_total_mib=32768, mem_used_mib=2048, mem_free_mib=30720)
    assert samples["GPU-b0-c0"] == only_memory
    lines = telemetry_lines(telemetry_log)
    said = {line.split()[1] for line in lines}
    assert said == {
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetTotalEccErrors",
    }
    assert len(lines) == len(said), "each missing call is said once, not for every chip and pass"
    assert all("is not in" in line and "that figure is left out" in line for line in lines)


def test_failing_and_unsupported_calls_leave_out_only_their_figure(
    ixml,  # type: ignore[no-untyped-def]
    telemetry_log: pytest.LogCaptureFixture,
) -> None:
    backend = ixml(TELEMETRY_DEVICES.format(extra="fail=temperature unsupported=board_power,pcie"))
    samples = backend.sample(backend.discover())
    broken, healthy = samples["GPU-b0-c1"], samples["GPU-b0-c0"]
    assert broken.temperature_c is None
    assert broken.power_w is None
    assert broken.pcie_tx_kbps is None and broken.pcie_rx_kbps is None
    assert broken.mem_total_mib == 32768, "the other calls still answer"
    assert healthy.temperature_c == 41 and healthy.power_w == 150.0
    lines = telemetry_lines(telemetry_log)
    assert any("ixmlDeviceGetBoardPowerUsage is not supported" in line for line in lines)
    assert "telemetry: GPU-b0-c1: nvmlDeviceGetTemperature failed: Unknown Error; that figure is left out" in lines


def test_a_telemetry_pass_of_its_own_backend_reads_figures_not_health(
    ixml,  # type: ignore[no-untyped-def]
    telemetry_log: pytest.LogCaptureFixture,
) -> None:
    """The telemetry worker's backend is not the health poll's: a pass names the chips by their handles and
    reads only the figures (health is the poll's job, and said by the poll's backend)."""
    backend = ixml(TELEMETRY_DEVICES.format(extra="gpu_util=5"), variant="old")
    samples = backend.sample(Inventory())
    assert set(samples) == {"GPU-b0-c0", "GPU-b0-c1"}
    assert samples["GPU-b0-c1"].mem_total_mib == 32768
    assert samples["GPU-b0-c1"].power_w == 71.0, "the old library has no board position: the chip's own power"
    assert "health checks are unavailable" not in telemetry_log.text


async def test_a_hung_telemetry_read_leaves_its_figure_out_and_health_and_liveness_alone(
    libs, plugin_dir: Path, tmp_path: Path, kubelet: KubeletStandIn
) -> None:  # type: ignore[no-untyped-def]
    """A wedged library call never returns, so the plugin runs as a process of its own, as in a pod."""
    conf = tmp_path / "ixml_double.conf"
    conf.write_text(TELEMETRY_DEVICES.format(extra="gpu_util=5 hang=utilization"))
    root = make_dev_root(tmp_path / "root", [0, 1])
    env = {key: value for key, value in os.environ.items() if not key.startswith("IX_")}
    env[CONFIG_ENV] = str(conf)
    port = free_port()
    command = [
        *(sys.executable, "-m", "ix_device_plugin", "run", "--backend", "ixml", "--ixml-library", str(libs["full"])),
        *("--dev-root", str(root), "--device-plugin-path", str(plugin_dir), *NO_NODE_FILES),
        *("--kubelet-plugins-directory-path", str(root / "plugins")),
        *("--health-address", f"127.0.0.1:{port}", "--health-interval", "0.2"),
        *("--telemetry-interval", "0.2", "--backend-timeout", "0.5", "--splitboard", "true"),
    ]
    plugin = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        view = await kubelet.wait_registered(RESOURCE, capacity=2, timeout=15)

        def with_the_hung_chip() -> dict[tuple[str, str], tuple[dict[str, str], float]] | None:
            series = scrape(port)
            return series if ("ix_gpu_temperature", "GPU-b0-c1") in series else None

        series = await asyncio.to_thread(until_sync, with_the_hung_chip, 15, 0.1, "the hung chip's temperature")
        assert series[("ix_gpu_utilization", "GPU-b0-c0")][1] == 87
        assert ("ix_gpu_utilization", "GPU-b0-c1") not in series, "the hung read's figure is left out"
        assert series[("ix_gpu_temperature", "GPU-b0-c1")][1] == 44, "the chip's other figures are read"

        # health polls and liveness go on, every pass after the hang too
        async def live() -> bool:
            return (await asyncio.to_thread(probe, port, "/healthz"))[0] == 200

        await stays(live, for_=1.0, interval=0.2, message="/healthz answering 200")
        assert set(view.devices.values()) == {HEALTHY} and len(view.devices) == 2
        stopping = time.monotonic()
        plugin.terminate()
        assert await asyncio.to_thread(plugin.wait, 10) == 0
        assert time.monotonic() - stopping < 2, "SIGTERM stops the plugin although a library call never returns"
    finally:
        stop_process(plugin)
    stderr = plugin.stderr.read().decode() if plugin.stderr else ""
    assert "Traceback" not in stderr
    assert stderr.count("nvmlDeviceGetUtilizationRates on GPU-b0-c1 did not return") == 1, stderr


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return int(probe_socket.getsockname()[1])


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


# ---- the exposition ------------------------------------------------------------------------


def test_collector_renders_ix_exporter_names_and_leaves_absent_figures_out() -> None:
    backend = SimulatedBackend("BI-V150:1")
    inventory = backend.discover()
    first, second = (chip.uuid for chip in inventory.chips())
    collector = TelemetryCollector("node-a")
    registry = CollectorRegistry()
    registry.register(collector)
    holder = PodRef("ml", "trainer-0", "main")
    collector.update(
        {first: ChipSample(temperature_c=50, mem_used_mib=10), second: ChipSample(temperature_c=51)},
        inventory,
        {first: (Holder(holder),)},
    )
    text = generate_latest(registry).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert set(families) == {"ix_gpu_temperature", "ix_temperature", "ix_mem_used"}
    assert set(families) <= set(METRIC_NAMES)
    (used,) = families["ix_mem_used"].samples
    assert used.labels == {
        "gpu": "0",
        "uuid": first,
        "name": "Iluvatar BI-V150",
        "node_name": "node-a",
        "driver": inventory.driver_version,
        "namespace": "ml",
        "pod": "trainer-0",
        "container": "main",
    }
    by_uuid = {sample.labels["uuid"]: sample for sample in families["ix_gpu_temperature"].samples}
    assert by_uuid[second].labels["pod"] == "" and by_uuid[second].labels["gpu"] == "1"
    assert by_uuid[second].value == 51


# ---- end to end: kubelet stand-in, pod-resources stand-in, real HTTP ------------------------


async def test_chips_allocated_to_a_pod_carry_its_labels(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    pod_resources = PodResourcesStandIn(short_dir / "pod-resources" / "kubelet.sock")
    await pod_resources.start()
    try:
        daemon: Daemon = await start_daemon(
            "BI-V150:2",
            health_address="127.0.0.1:0",
            telemetry_interval=0.1,
            pod_resources_socket=pod_resources.socket_path,
            node_name="gpu-node-1",
            given=config_flags(splitboard="true"),
        )
        view = await kubelet.wait_registered(RESOURCE, capacity=4)
        chosen = sorted(view.devices)[:2]
        response = await kubelet.allocate(RESOURCE, [chosen])
        assert response.container_responses
        pod_resources.pods = {("ml", "trainer-0"): {"main": {RESOURCE: chosen}, "sidecar": {}}}
        held = {chip.uuid for device_id in chosen for chip in daemon.plan.by_id[device_id].chips}

        def attributed() -> bool:
            series = scrape(daemon.node.probe_port)
            return {uuid for (name, uuid), (labels, _) in series.items() if labels["pod"] == "trainer-0"} == held

        await asyncio.to_thread(until_sync, attributed, 10.0)
        series = await asyncio.to_thread(scrape, daemon.node.probe_port)
        for (_name, uuid), (labels, _) in series.items():
            assert labels["node_name"] == "gpu-node-1"
            if uuid in held:
                assert (labels["namespace"], labels["container"]) == ("ml", "main")
            else:
                assert labels["pod"] == "" and labels["namespace"] == ""
        assert {name for name, _ in series} == set(METRIC_NAMES)

        # The kubelet's socket goes away: figures go on, without pod labels, and come back with them.
        await pod_resources.stop()
        await asyncio.to_thread(
            until_sync, lambda: all(labels["pod"] == "" for labels, _ in scrape(daemon.node.probe_port).values()), 10.0
        )
        await pod_resources.start()
        await asyncio.to_thread(until_sync, attributed, 10.0)
    finally:
        await pod_resources.stop()


async def test_no_telemetry_metrics_when_it_is_off(kubelet: KubeletStandIn, start_daemon: DaemonFactory) -> None:
    daemon = await start_daemon("BI-V150:1", health_address="127.0.0.1:0")
    await kubelet.wait_registered(RESOURCE)
    assert await asyncio.to_thread(scrape, daemon.node.probe_port) == {}


def test_the_name_label_says_iluvatar_once_whatever_the_library_calls_the_product() -> None:
    from dataclasses import replace

    inventory = SimulatedBackend("BI-V100:1").discover()
    board = inventory.boards[0]
    raw = replace(inventory, boards=(replace(board, chips=(replace(board.chips[0], product="Iluvatar BI-V100"),)),))
    collector = TelemetryCollector("node-a")
    registry = CollectorRegistry()
    registry.register(collector)
    for named in (inventory, raw):  # the simulated name, and IXML's with its vendor prefix
        collector.update({board.chips[0].uuid: ChipSample(temperature_c=50)}, named, {})
        text = generate_latest(registry).decode()
        (family,) = [f for f in text_string_to_metric_families(text) if f.name == "ix_gpu_temperature"]
        assert family.samples[0].labels["name"] == "Iluvatar BI-V100"
