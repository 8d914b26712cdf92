"""The healer's metrics, under the same names in both front ends' registries."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from ix_device_plugin.core.healing import HEALTHY, PHASES
from ix_device_plugin.runtime.lazymetrics import Counter, Histogram, Registry

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

PREFIX = "ix_device_plugin"
RESET_RESULTS = ("ok", "failed", "refused", "still_unhealthy", "unproven", "diagnostic_failed", "unavailable")
OUTCOMES = ("healed", "needs_operator")
EVENT_WRITES = ("create", "patch", "failed")
_OUT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)


class HealingMetrics:
    """Healing resets by result, episodes by outcome, time out of service, chips by phase, Event writes and drops."""

    def __init__(self, registry: Registry, phases: Callable[[], Mapping[str, int]]) -> None:
        r = registry
        self.resets = Counter(
            f"{PREFIX}_healing_resets", "Resets of out-of-service chips by the healer, by result", ["result"],
            registry=r,
        )  # fmt: skip
        self.outcomes = Counter(
            f"{PREFIX}_healing_outcomes",
            "Chips the healer returned to service (healed), or left to an operator (needs_operator)", ["outcome"],
            registry=r,
        )  # fmt: skip
        self.out_of_service = Histogram(
            f"{PREFIX}_gpu_out_of_service_seconds", "Time a chip was out of service, observed when it returns",
            buckets=_OUT_BUCKETS, registry=r,
        )  # fmt: skip
        self.event_writes = Counter(
            f"{PREFIX}_node_event_writes", "API writes of Node Events (create, patch of the count), and failures",
            ["verb"], registry=r,
        )  # fmt: skip
        self.events_dropped = Counter(
            f"{PREFIX}_node_events_dropped",
            "Node Event occurrences never written: pushed out of the Events kept, refused, or pending at stop",
            registry=r,
        )
        for result in RESET_RESULTS:
            self.resets.labels(result=result)
        for outcome in OUTCOMES:
            self.outcomes.labels(outcome=outcome)
        for verb in EVENT_WRITES:
            self.event_writes.labels(verb=verb)
        r.register(_PhaseCollector(phases))


class _PhaseCollector:
    """Chips out of service by phase, read from the healer at scrape time."""

    def __init__(self, phases: Callable[[], Mapping[str, int]]) -> None:
        self._phases = phases

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import GaugeMetricFamily

        counts = self._phases()
        family = GaugeMetricFamily(
            f"{PREFIX}_gpus_out_of_service",
            "Chips out of service, by what the healer does about them (waiting, resetting, operator, out, off)",
            labels=["phase"],
        )
        for phase in PHASES:
            if phase != HEALTHY:
                family.add_metric([phase], counts.get(phase, 0))
        yield family
