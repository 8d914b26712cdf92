"""The DRA mode's metrics on /metrics: what the kubelet asked and how it went, and the driver's state.

prometheus_client is loaded at the first scrape.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from ix_device_plugin.gpureset.outcome import RESET_RESULTS
from ix_device_plugin.runtime.lazymetrics import Counter, Histogram, Registry

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

PREFIX = "ix_device_plugin_dra"
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


_RESET_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
PreparedDevices = Callable[[], dict[tuple[str, str], int]]  # (type, held) -> prepared devices


class DraMetrics:
    """Counters and histograms of the kubelet's calls and of GPU resets, plus gauges read from the driver at
    scrape time."""

    def __init__(self, state: Callable[[], dict[str, float]], prepared: PreparedDevices = dict) -> None:
        self.registry = Registry()
        r = self.registry
        self.calls = Counter(
            f"{PREFIX}_claims", "Claims the kubelet asked to prepare or unprepare, by call and result",
            ["call", "result"], registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            f"{PREFIX}_claim_duration_seconds", "Time to prepare or unprepare one claim", ["call"],
            buckets=_BUCKETS, registry=r,
        )  # fmt: skip
        self.gpu_resets = Counter(
            f"{PREFIX}_gpu_resets", "GPU resets of claims configured with reset: true, by result", ["result"],
            registry=r,
        )  # fmt: skip
        self.gpu_reset_duration = Histogram(
            f"{PREFIX}_gpu_reset_duration_seconds",
            "Time from asking other IXML users to let go to the chips rediscovered", buckets=_RESET_BUCKETS,
            registry=r,
        )  # fmt: skip
        for result in RESET_RESULTS:
            self.gpu_resets.labels(result=result)
        for call in ("prepare", "unprepare"):
            self.duration.labels(call=call)
            for result in ("ok", "error"):
                self.calls.labels(call=call, result=result)
        r.register(_StateCollector(state, prepared))

    async def timed(self, call: str, work: Awaitable[Any]) -> Any:
        """work's outcome, counted as ok (no error message) or error, and timed."""
        started = time.perf_counter()
        outcome = await work
        self.duration.labels(call=call).observe(time.perf_counter() - started)
        failed = isinstance(outcome, str) and outcome
        self.calls.labels(call=call, result="error" if failed else "ok").inc()
        return outcome

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return self.registry.render()

    def observe_xid(self, xid: int) -> None:
        """XIDs are not counted in DRA mode (the device plugin's xid_events): the node-health record keeps them."""

    def observe_health_poll(self) -> None:
        """Health polls are not timed in DRA mode (the device plugin's last_health_poll)."""


# name -> (help, counter or gauge)
_FIGURES: dict[str, tuple[str, bool]] = {
    "registered": ("1 while registered with the kubelet", False),
    "slice_devices": ("Devices in the node's ResourceSlices", False),
    "prepared_claims": ("ResourceClaims prepared on the node", False),
    "restored_claims": ("Prepared claims found in the checkpoint at start", False),
    "health_changes": ("Device health changes sent to the kubelet", True),
    "slice_repairs": ("Times the node's ResourceSlices were found changed or deleted by someone else", True),
    "slice_publisher": ("1 while this pod publishes the node's ResourceSlices, 0 on standby behind another pod", False),
}


class _StateCollector:
    """The driver's state, read at scrape time."""

    def __init__(self, state: Callable[[], dict[str, float]], prepared: PreparedDevices) -> None:
        self._state = state
        self._prepared = prepared

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        values = self._state()
        for name, (help_text, counter) in _FIGURES.items():
            family = CounterMetricFamily if counter else GaugeMetricFamily
            yield family(f"{PREFIX}_{name}", help_text, value=values.get(name, 0))
        devices = GaugeMetricFamily(
            f"{PREFIX}_prepared_devices",
            "Devices of the prepared claims, by type (chip, board) and how each is held (whole, share, admin)",
            labels=["type", "held"],
        )
        counts = self._prepared()
        for kind in ("chip", "board"):
            for held in ("whole", "share", "admin"):
                devices.add_metric([kind, held], counts.get((kind, held), 0))
        yield devices
