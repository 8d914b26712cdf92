"""Re-registration: from a kubelet restart (directory wiped, kubelet.sock re-created) to the full list."""

from __future__ import annotations

import time
from typing import Any

from bench.plugin import LARGE, ONE_GPU, PluginProcess
from bench.settings import Settings
from bench.stats import summary_ms


async def run(settings: Settings) -> dict[str, Any]:
    """Median and max times to be registered and listed again after each of several kubelet restarts."""
    result: dict[str, Any] = {}
    for key, node in (("one_gpu", ONE_GPU), ("large", LARGE)):
        async with PluginProcess(node) as plugin:
            await plugin.launch()
            samples: list[float] = []
            for _ in range(settings.reregistrations):
                await plugin.kubelet.restart()
                restarted = time.perf_counter()
                await plugin.wait_listed()
                samples.append(time.perf_counter() - restarted)
        result[key] = {"devices": node.capacity, **summary_ms(samples)}
    return result
