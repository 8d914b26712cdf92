"""Allocate and GetPreferredAllocation latency against the plugin, and against the transport's floor."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bench import procfs
from bench.load import Load, allocate_calls, measure, preferred_calls
from bench.plugin import LARGE, ONE_GPU, PluginProcess, short_dir, stop_process, track
from bench.settings import Settings
from ix_device_plugin.kubelet.sockets import unix_target

PREFERRED_SIZE = 8
_ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def baseline_server() -> AsyncIterator[tuple[str, int]]:
    """bench.baseline_server in its own process: its gRPC target and process ID."""
    workdir = short_dir()
    socket = workdir / "baseline.sock"
    command = [sys.executable, "-m", "bench.baseline_server", str(socket)]
    process = subprocess.Popen(command, cwd=_ROOT, stdin=subprocess.DEVNULL)
    track(process)
    try:
        yield unix_target(socket), process.pid
    finally:
        await stop_process(process)
        shutil.rmtree(workdir, ignore_errors=True)


async def _workloads(targets: Mapping[str, str], device_ids: list[str], load: Load) -> dict[str, dict[str, Any]]:
    """Both calls against every target (same requests), keyed by target name."""
    size = min(PREFERRED_SIZE, len(device_ids))
    allocate = await measure(targets, allocate_calls(device_ids), load)
    preferred = await measure(targets, preferred_calls(device_ids, size), load)
    return {
        name: {
            "devices": len(device_ids),
            "preferred_size": size,
            "allocate": allocate[name],
            "preferred": preferred[name],
        }
        for name in targets
    }


def _p50(section: Mapping[str, Any], call: str, mode: str) -> float:
    return section[call][mode]["p50_ms"]


def ratios(plugin: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, float]:
    """Plugin p50 over baseline p50 for each call and mode (1.0: at the transport's floor)."""
    return {
        f"{call}_{mode}": round(_p50(plugin, call, mode) / _p50(baseline, call, mode), 2)
        for call in ("allocate", "preferred")
        for mode in ("sequential", "concurrent")
    }


async def run(settings: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """The latency section (1 GPU, large node) and the baseline section, measured in turns with the large node."""
    latency: dict[str, Any] = {}
    async with PluginProcess(ONE_GPU) as plugin:
        device_ids = list((await plugin.launch()).devices)
        latency["one_gpu"] = (await _workloads({"plugin": plugin.target}, device_ids, settings.load))["plugin"]
    async with PluginProcess(LARGE) as plugin, baseline_server() as (baseline_target, baseline_pid):
        device_ids = list((await plugin.launch()).devices)
        targets = {"plugin": plugin.target, "baseline": baseline_target}
        both = await _workloads(targets, device_ids, settings.load)
        baseline = both["baseline"]
        baseline["rss_mib"] = procfs.rss_mib(baseline_pid)
        baseline["threads"] = procfs.threads(baseline_pid)
    latency["large"] = both["plugin"]
    baseline["ratio_p50"] = ratios(latency["large"], baseline)
    return latency, baseline
