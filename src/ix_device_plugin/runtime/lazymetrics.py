"""Counters, gauges, histograms and an info metric kept as plain numbers.

Exported exactly as prometheus_client exports its own (same families, samples and `_created` series).

prometheus_client imports an HTTP and e-mail stack with it (about 3 MiB resident); here it is imported
when metrics are first rendered or read (a scrape of /metrics), never to count.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

# What prometheus_client's generate_latest writes (its CONTENT_TYPE_PLAIN_0_0_4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# (sample name suffix, extra labels, value)
Sample = tuple[str, dict[str, str], float]


class Collector(Protocol):
    """Anything that yields metric families at scrape time (prometheus_client's collector interface)."""

    def collect(self) -> Iterable[Metric]: ...


class Gated:
    """collector's families while when() holds, none otherwise (a node-wide figure exported by one pod at a time)."""

    def __init__(self, collector: Collector, when: Callable[[], bool]) -> None:
        self._collector = collector
        self._when = when

    def collect(self) -> Iterable[Metric]:
        return self._collector.collect() if self._when() else ()


def _created_series() -> bool:
    """prometheus_client's switch for the `_created` samples (PROMETHEUS_DISABLE_CREATED_SERIES)."""
    return os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1", "t")


class Registry:
    """The collectors of one process, in the order they were registered."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []
        self._lock = threading.Lock()

    def register(self, collector: Collector) -> None:
        """Export collector's families after those registered before it."""
        with self._lock:
            self._collectors.append(collector)

    def collect(self) -> Iterator[Metric]:
        """Every family, now."""
        with self._lock:
            collectors = list(self._collectors)
        for collector in collectors:
            yield from collector.collect()

    def get_sample_value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The value of the sample called name with exactly these labels, None when there is none."""
        wanted = dict(labels or {})
        for metric in self.collect():
            for sample in metric.samples:
                if sample.name == name and sample.labels == wanted:
                    return float(sample.value)
        return None

    def render(self) -> bytes:
        """The Prometheus text exposition (format 0.0.4) of every family."""
        from prometheus_client import generate_latest

        return generate_latest(self)  # type: ignore[arg-type]  # it only calls collect()


class Value:
    """One series of a counter or gauge."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        """Add amount."""
        self.value += amount

    def set(self, value: float) -> None:
        """Make the value value."""
        self.value = float(value)


class HistogramValue:
    """One series of a histogram: a count per bucket (upper bounds, the last +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        """Count amount in the first bucket whose bound it does not exceed."""
        self.sum += amount
        for index, bound in enumerate(self.bounds):
            if amount <= bound:
                self.counts[index] += 1
                break


class _Family:
    """A metric with zero or more labels; each label value set is a series, made when first used."""

    kind = ""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), registry: Registry | None = None
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()
        if not self.labelnames:
            self._series[()] = self._new_series()
        if registry is not None:
            registry.register(self)

    def _new_series(self) -> Any:
        raise NotImplementedError

    def _samples(self, series: Any) -> Iterable[Sample]:
        raise NotImplementedError

    def labels(self, **labels: str) -> Any:
        """The series with these label values (all of the metric's label names, no others)."""
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes the labels {', '.join(self.labelnames) or 'none'}")
        key = tuple(str(labels[name]) for name in self.labelnames)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = self._new_series()
        return series

    def _only(self) -> Any:
        if self.labelnames:
            raise ValueError(f"{self.name} has labels: use .labels(...)")
        return self._series[()]

    def collect(self) -> list[Metric]:
        """The family as prometheus_client's own metric of this kind reports it."""
        from prometheus_client.metrics_core import Metric

        metric = Metric(self.name, self.documentation, self.kind)
        with self._lock:
            series = list(self._series.items())
        for key, values in series:
            labels = dict(zip(self.labelnames, key, strict=True))
            for suffix, extra, value in self._samples(values):
                metric.add_sample(self.name + suffix, {**labels, **extra}, value)
        return [metric]


class Counter(_Family):
    """A count that only goes up (exported as `<name>_total` and `<name>_created`)."""

    kind = "counter"

    def _new_series(self) -> Value:
        return Value()

    def _samples(self, series: Value) -> Iterable[Sample]:
        yield "_total", {}, series.value
        if _created_series():
            yield "_created", {}, series.created

    def inc(self, amount: float = 1.0) -> None:
        """Add amount to the unlabelled count."""
        self._only().inc(amount)


class Gauge(_Family):
    """A value that is set."""

    kind = "gauge"

    def _new_series(self) -> Value:
        return Value()

    def _samples(self, series: Value) -> Iterable[Sample]:
        yield "", {}, series.value

    def set(self, value: float) -> None:
        """Set the unlabelled value."""
        self._only().set(value)


class Histogram(_Family):
    """Observations counted in buckets, with their sum."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: Registry | None = None,
    ) -> None:
        bounds = [float(bound) for bound in buckets]
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds = tuple(bounds)
        super().__init__(name, documentation, labelnames, registry)

    def _new_series(self) -> HistogramValue:
        return HistogramValue(self.bounds)

    def _samples(self, series: HistogramValue) -> Iterable[Sample]:
        from prometheus_client.utils import floatToGoString

        total = 0.0
        for bound, count in zip(series.bounds, series.counts, strict=True):
            total += count
            yield "_bucket", {"le": floatToGoString(bound)}, total
        yield "_count", {}, total
        if series.bounds[0] >= 0:
            yield "_sum", {}, series.sum
        if _created_series():
            yield "_created", {}, series.created

    def observe(self, amount: float) -> None:
        """Count one unlabelled observation."""
        self._only().observe(amount)


class Info(_Family):
    """Constant key-value facts (exported as `<name>_info` with them as labels, value 1)."""

    kind = "info"

    def _new_series(self) -> dict[str, str]:
        return {}

    def _samples(self, series: dict[str, str]) -> Iterable[Sample]:
        yield "_info", dict(series), 1.0

    def info(self, values: Mapping[str, str]) -> None:
        """Set the facts."""
        facts = self._only()
        facts.clear()
        facts.update(values)
