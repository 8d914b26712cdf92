"""Summaries of samples: nearest-rank percentiles, in milliseconds."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of values."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    """The median of values (mean of the middle two for an even count)."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def ms(seconds: float) -> float:
    """seconds in milliseconds, rounded to the microsecond."""
    return round(seconds * 1000, 3)


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """Count, median, p99 and max of durations given in seconds, in milliseconds."""
    return {
        "n": len(seconds),
        "median_ms": ms(median(seconds)),
        "p99_ms": ms(percentile(seconds, 99)),
        "max_ms": ms(max(seconds)),
    }


def latency_ms(seconds: Sequence[float]) -> dict[str, float]:
    """Count, p50, p99 and max of call latencies given in seconds, in milliseconds."""
    return {
        "n": len(seconds),
        "p50_ms": ms(percentile(seconds, 50)),
        "p99_ms": ms(percentile(seconds, 99)),
        "max_ms": ms(max(seconds)),
    }
