"""Hostile configs: how long the loader takes to refuse each file of tests/hostile/configs, and its peak memory."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.settings import Settings
from ix_device_plugin.settings.configfile import load_document
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import config_from

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "hostile" / "configs"


def _check(data: bytes) -> None:
    try:
        for config in load_document(data, "bench").values():
            config_from(config, {})
    except SettingsError:
        pass


def _measure(data: bytes, runs: int) -> tuple[float, float]:
    """Best-of-runs parse time in ms, and peak traced memory in KiB."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        _check(data)
        best = min(best, time.perf_counter() - started)
    tracemalloc.start()
    _check(data)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return best * 1000, peak / 1024


async def run(settings: Settings) -> dict[str, Any]:
    """Per case and the worst: refuse time (ms) and peak memory (KiB)."""
    runs = 1 if settings.smoke else 20
    cases = {path.name: _measure(path.read_bytes(), runs) for path in sorted(CORPUS.iterdir())}
    slowest = max(cases, key=lambda name: cases[name][0])
    hungriest = max(cases, key=lambda name: cases[name][1])
    return {
        "cases": len(cases),
        "worst_ms": round(cases[slowest][0], 3),
        "worst_peak_kib": round(cases[hungriest][1], 1),
        "per_case": {name: {"ms": round(ms, 3), "peak_kib": round(kib, 1)} for name, (ms, kib) in cases.items()},
    }
