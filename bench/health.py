"""Health to scheduler: from a chip's health changing in the simulated file to the ListAndWatch message."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from bench.plugin import LARGE, RESOURCE, PluginProcess, write_atomically
from bench.settings import Settings
from bench.stats import summary_ms
from ix_device_plugin.api import HEALTHY, UNHEALTHY


def _health_is(plugin: PluginProcess, device: str, health: str) -> bool:
    view = plugin.kubelet.resources.get(RESOURCE)
    return view is not None and view.devices.get(device) == health


async def run(settings: Settings) -> dict[str, Any]:
    """Times for the first chip to be reported Unhealthy and Healthy again, changed at spread-out poll phases."""
    node, interval = LARGE, settings.health_interval
    # Phases 0, 1/n, ... of the poll cycle, in a fixed shuffled order: phase 0 (just after a poll) is the worst case.
    phases = [index / settings.health_flips for index in range(settings.health_flips)]
    random.Random(7).shuffle(phases)
    device = node.first_chip_device()
    samples: dict[str, list[float]] = {UNHEALTHY: [], HEALTHY: []}
    async with PluginProcess(node, health_interval=interval, devices_file=True) as plugin:
        await plugin.launch()
        assert plugin.devices_path is not None
        for flip, phase in enumerate(phases):
            health = UNHEALTHY if flip % 2 == 0 else HEALTHY
            await asyncio.sleep(phase * interval)  # the last poll has just been seen; wait into the cycle
            write_atomically(plugin.devices_path, node.devices_yaml(("ECC",) if health == UNHEALTHY else ()))
            written = time.perf_counter()
            await plugin.kubelet.wait_for(lambda h=health: _health_is(plugin, device, h), timeout=3 * interval + 5)
            samples[health].append(time.perf_counter() - written)
    return {
        "devices": node.capacity,
        "interval_s": interval,
        "to_unhealthy": summary_ms(samples[UNHEALTHY]),
        "to_healthy": summary_ms(samples[HEALTHY]),
        "all": summary_ms(samples[UNHEALTHY] + samples[HEALTHY]),
    }
