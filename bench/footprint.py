"""Footprint of the plugin on the large node: memory, idle CPU and threads, before and after many calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from bench import procfs
from bench.load import Call, allocate_calls, preferred_calls, run_concurrent
from bench.plugin import LARGE, PluginProcess
from bench.settings import Settings

PREFERRED_EVERY = 10  # one call in ten is GetPreferredAllocation, the rest Allocate
PREFERRED_SIZE = 8
DEFAULT_HEALTH_INTERVAL = 5.0  # the plugin's own default: the benchmark does not pass --health-interval


def mixed_calls(device_ids: Sequence[str]) -> list[Call]:
    """Allocate for each device in turn, with a GetPreferredAllocation for 8 of all in every tenth call."""
    preferred = preferred_calls(device_ids, PREFERRED_SIZE)[0]
    calls: list[Call] = []
    for call in allocate_calls(device_ids):
        calls.append(call)
        if len(calls) % PREFERRED_EVERY == PREFERRED_EVERY - 1:
            calls.append(preferred)
    return calls


async def idle_cpu_percent(pid: int, seconds: float) -> float:
    """CPU pid uses over seconds of wall time, in percent of one core."""
    cpu, wall = procfs.cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return round((procfs.cpu_seconds(pid) - cpu) / (time.monotonic() - wall) * 100, 3)


async def _calls_in_chunks(plugin: PluginProcess, calls: list[Call], settings: Settings) -> list[float]:
    """Make the footprint calls in equal chunks; RSS (MiB) after each chunk."""
    series: list[float] = []
    chunk = settings.footprint_calls // settings.footprint_chunks
    for _ in range(settings.footprint_chunks):
        await run_concurrent(plugin.target, calls, chunk, settings.load.callers, 0)
        series.append(procfs.rss_mib(plugin.pid))
    return series


async def run(settings: Settings) -> dict[str, Any]:
    """RSS and threads after start, idle CPU with the default health interval, RSS during many calls."""
    result: dict[str, Any] = {"devices": LARGE.capacity, "health_interval_s": DEFAULT_HEALTH_INTERVAL}
    async with PluginProcess(LARGE, devices_file=True) as plugin:
        view = await plugin.launch()
        await asyncio.sleep(settings.settle_seconds)
        pid = plugin.pid
        result["rss_start_mib"] = procfs.rss_mib(pid)
        result["threads_start"] = procfs.threads(pid)
        result["idle_seconds"] = settings.idle_seconds
        result["idle_cpu_percent"] = await idle_cpu_percent(pid, settings.idle_seconds)
        cpu = procfs.cpu_seconds(pid)
        series = await _calls_in_chunks(plugin, mixed_calls(list(view.devices)), settings)
        result["calls"] = settings.footprint_calls
        result["cpu_us_per_call"] = round((procfs.cpu_seconds(pid) - cpu) / settings.footprint_calls * 1e6, 1)
        result["rss_series_mib"] = series
        result["rss_half_mib"] = series[len(series) // 2 - 1]
        result["rss_after_calls_mib"] = series[-1]
        result["rss_growth_second_half_mib"] = round(series[-1] - result["rss_half_mib"], 2)
        result["peak_rss_mib"] = procfs.peak_rss_mib(pid)
        result["threads_after_calls"] = procfs.threads(pid)
    return result
