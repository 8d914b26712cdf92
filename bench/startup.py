"""Start-up: from starting the process to Register succeeding, and to the full list at the kubelet."""

from __future__ import annotations

import time
from typing import Any

from bench.plugin import LARGE, ONE_GPU, Node, PluginProcess
from bench.settings import Settings
from bench.stats import summary_ms


async def _start_once(node: Node) -> tuple[float, float]:
    async with PluginProcess(node) as plugin:
        started = plugin.spawn()
        await plugin.wait_listed()
        listed = time.perf_counter()
        return plugin.kubelet.registered_at[0] - started, listed - started


async def run(settings: Settings) -> dict[str, Any]:
    """Median start-up times on one GPU and on the large node."""
    result: dict[str, Any] = {}
    for key, node in (("one_gpu", ONE_GPU), ("large", LARGE)):
        samples = [await _start_once(node) for _ in range(settings.startup_runs)]
        result[key] = {
            "devices": node.capacity,
            "to_register": summary_ms([registered for registered, _ in samples]),
            "to_list": summary_ms([listed for _, listed in samples]),
        }
    return result
