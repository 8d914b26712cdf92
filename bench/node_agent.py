"""The node-agent parts (CDI spec, node labels, GPU telemetry with pod attribution): what they cost.

Resident memory and idle CPU of the plugin with every part on at its default interval, next to the same
node with them off; and the cost of one telemetry pass on 16 boards x 2 chips (the simulated backend, the
IXML binding over the C test double when a C compiler is there, and rendering the exposition).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from bench import procfs
from bench.footprint import idle_cpu_percent
from bench.plugin import Node, PluginProcess, short_dir
from bench.settings import Settings
from ix_device_plugin.core.plan import plan
from ix_device_plugin.core.telemetry import PodRef, plugin_holders
from ix_device_plugin.hardware.ixml import IxmlBackend
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.podresources import PodResourcesStandIn
from ix_device_plugin.telemetry.collector import TelemetryCollector

NODE = Node("16 x BI-V150, split (32 chips)", "BI-V150", 16, splitboard=True)
DOUBLE_SOURCE = Path(__file__).resolve().parents[1] / "tests" / "ixml_double" / "libixml_double.c"
PASSES = 50


async def run(settings: Settings) -> dict[str, Any]:
    """Footprint with the parts off and on; one telemetry pass, timed."""
    off = await _footprint((), settings)
    on = await _with_parts_on(settings)
    return {
        "chips": NODE.boards * NODE.chips_per_board,
        "off": off,
        "on": on,
        "rss_added_mib": round(on["rss_mib"] - off["rss_mib"], 2),
        "idle_cpu_added_percent": round(on["idle_cpu_percent"] - off["idle_cpu_percent"], 3),
        "pass": telemetry_pass_costs(),
    }


async def _with_parts_on(settings: Settings) -> dict[str, Any]:
    workdir = short_dir()
    pod_resources = PodResourcesStandIn(workdir / "pod-resources" / "kubelet.sock")
    await pod_resources.start()
    try:
        parts = ("--cdi-spec-dir", str(workdir / "cdi"), "--node-feature-dir", str(workdir / "features.d"))
        parts += ("--telemetry-interval", "15", "--pod-resources-socket", str(pod_resources.socket_path))
        return await _footprint(parts, settings, pod_resources)
    finally:
        await pod_resources.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def _footprint(
    extra_args: tuple[str, ...], settings: Settings, pod_resources: PodResourcesStandIn | None = None
) -> dict[str, Any]:
    async with PluginProcess(NODE, extra_args=extra_args) as plugin:
        view = await plugin.launch()
        if pod_resources is not None:  # half the chips held by pods, one pod per device
            held = sorted(view.devices)[: len(view.devices) // 2]
            pod_resources.pods = {
                ("bench", f"pod-{i}"): {"main": {"iluvatar.com/gpu": [d]}} for i, d in enumerate(held)
            }
        await asyncio.sleep(settings.settle_seconds)
        pid = plugin.pid
        return {
            "rss_mib": procfs.rss_mib(pid),
            "idle_seconds": settings.idle_seconds,
            "idle_cpu_percent": await idle_cpu_percent(pid, settings.idle_seconds),
            "threads": procfs.threads(pid),
            "pod_resources_calls": pod_resources.calls if pod_resources is not None else 0,
        }


def telemetry_pass_costs() -> dict[str, Any]:
    """Median ms of one pass on 32 chips: simulated sample, IXML-double sample, exposition rendering."""
    simulated = SimulatedBackend(NODE.spec)
    inventory = simulated.discover()
    result: dict[str, Any] = {"passes": PASSES, "simulated_sample_ms": _median_ms(lambda: simulated.sample(inventory))}
    double = _ixml_double_pass_ms()
    if double is not None:
        result["ixml_double_sample_ms"] = double
    collector = TelemetryCollector("bench-node")
    registry = CollectorRegistry()
    registry.register(collector)
    node_plan = plan(inventory, Config(splitboard=True))
    holders = {device.id: PodRef("bench", f"pod-{i}", "main") for i, device in enumerate(node_plan.devices)}
    samples = simulated.sample(inventory)
    collector.update(samples, inventory, plugin_holders(node_plan, holders))
    result["render_ms"] = _median_ms(lambda: generate_latest(registry))
    result["exposition_bytes"] = len(generate_latest(registry))
    return result


def _ixml_double_pass_ms() -> float | None:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory() as workdir:
        root = Path(workdir)
        library = root / "libixml.so"
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(DOUBLE_SOURCE)], check=True)
        (root / "dev").mkdir()
        lines = ["driver=4.1.0"]
        for board in range(NODE.boards):
            for position in range(2):
                minor = board * 2 + position
                (root / "dev" / f"iluvatar{minor}").touch()
                lines.append(
                    f'device uuid=GPU-{minor:04d} name="Iluvatar BI-V150" minor={minor} board=B{board} '
                    f"position={position} temp=40 power=70000 board_power=150000 gpu_util=50 mem_used=1024"
                )
        config = root / "double.conf"
        config.write_text("\n".join(lines) + "\n")
        return _double_median(library, root, config)


def _double_median(library: Path, root: Path, config: Path) -> float:
    previous = os.environ.get("IXML_DOUBLE_CONFIG")
    os.environ["IXML_DOUBLE_CONFIG"] = str(config)
    backend = IxmlBackend(str(library), dev_root=root, sysfs_root=root / "sys")
    try:
        inventory = backend.discover()
        return _median_ms(lambda: backend.sample(inventory))
    finally:
        backend.close()
        if previous is None:
            os.environ.pop("IXML_DOUBLE_CONFIG", None)
        else:
            os.environ["IXML_DOUBLE_CONFIG"] = previous


def _median_ms(work: Callable[[], object]) -> float:
    times = []
    for _ in range(PASSES):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)
