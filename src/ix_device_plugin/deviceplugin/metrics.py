"""Prometheus metrics of the plugin, in a registry of its own (prometheus_client is loaded at the first scrape)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ix_device_plugin import __version__
from ix_device_plugin.deviceplugin.state import State
from ix_device_plugin.gpureset.outcome import RESET_RESULTS
from ix_device_plugin.runtime.lazymetrics import Counter, Gated, Gauge, Histogram, Info, Registry
from ix_device_plugin.settings.health import xid_label
from ix_device_plugin.telemetry.nodestate import PREFIX, Devices, NodeStateCollector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

_RESET_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class Metrics:
    """Every metric the plugin exports; one instance per process."""

    def __init__(self) -> None:
        self.registry = Registry()
        r = self.registry
        self.build_info = Info(f"{PREFIX}_build", "Build of the plugin", registry=r)
        self.build_info.info({"version": __version__})
        self.registrations = Counter(f"{PREFIX}_registrations", "Successful registrations with the kubelet", registry=r)
        self.registration_failures = Counter(
            f"{PREFIX}_registration_failures", "Failed registration attempts", registry=r
        )
        self.reregistrations = Counter(
            f"{PREFIX}_reregistrations", "Registrations after a kubelet restart or lost socket", registry=r
        )
        self.calls = Counter(f"{PREFIX}_calls", "gRPC calls served", ["method"], registry=r)
        self.call_errors = Counter(f"{PREFIX}_call_errors", "gRPC calls refused", ["method", "code"], registry=r)
        self.call_latency = Histogram(
            f"{PREFIX}_call_duration_seconds",
            "Time to answer a gRPC call",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.last_health_poll = Gauge(
            f"{PREFIX}_last_health_poll_timestamp_seconds",
            "When the last successful health poll finished",
            registry=r,
        )
        self.config_reloads = Counter(f"{PREFIX}_config_reloads", "Configuration changes applied", registry=r)
        self.config_reload_failures = Counter(
            f"{PREFIX}_config_reload_failures", "Configuration changes rejected as invalid", registry=r
        )
        self._add_hardware_metrics(r)
        for method in ("Allocate", "GetPreferredAllocation"):
            self.calls.labels(method=method)
            self.call_latency.labels(method=method)

    def _add_hardware_metrics(self, r: Registry) -> None:
        """The GPU resets' and the XID events' metrics."""
        self.gpu_resets = Counter(
            f"{PREFIX}_gpu_resets", "GPU resets before Allocate (flags.reset_gpu), by result", ["result"], registry=r
        )
        self.gpu_reset_duration = Histogram(
            f"{PREFIX}_gpu_reset_duration_seconds",
            "Time from asking other IXML users to let go to the chips rediscovered",
            buckets=_RESET_BUCKETS,
            registry=r,
        )
        self.xid_events = Counter(
            f"{PREFIX}_xid_events",
            "Critical XID events the GPU library reported, ignored ones too, by XID (those the health policy table "
            "lists; any other as other)",
            ["xid"],
            registry=r,
        )
        for result in RESET_RESULTS:
            self.gpu_resets.labels(result=result)

    def observe_xid(self, xid: int) -> None:
        """Count one critical XID event, under a label of a bounded set whatever the number."""
        self.xid_events.labels(xid=xid_label(xid)).inc()

    def observe_call(self, method: str, seconds: float, error: str | None) -> None:
        """Record one gRPC call."""
        self.calls.labels(method=method).inc()
        self.call_latency.labels(method=method).observe(seconds)
        if error is not None:
            self.call_errors.labels(method=method, code=error).inc()

    def read_state_from(
        self, state: Callable[[], State], registered: Callable[[], bool], acting: Callable[[], bool] = lambda: True
    ) -> None:
        """Export the devices, chips and registration as they are at each scrape, while this pod acts for the node
        (a pod on standby beside it during an update exports none: the dashboard counts each node once)."""

        def devices() -> Devices:
            plan = state().plan
            return Devices(plan.resource_name, plan.capacity(), plan.healthy_count())

        self.registry.register(Gated(NodeStateCollector(devices, lambda: state().inventory, registered), acting))

    def read_role_from(self, acting: Callable[[], bool]) -> None:
        """Export whether this pod acts for the node, as it is at each scrape."""
        self.registry.register(_RoleCollector(acting))

    def observe_health_poll(self) -> None:
        """Record a successful health poll."""
        self.last_health_poll.set(time.time())

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return self.registry.render()


class _RoleCollector:
    """ix_device_plugin_acting_for_node: 1 in the pod acting for the node, 0 in a pod on standby beside it."""

    def __init__(self, acting: Callable[[], bool]) -> None:
        self._acting = acting

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import GaugeMetricFamily

        yield GaugeMetricFamily(
            f"{PREFIX}_acting_for_node",
            "1 while this pod acts for the node (resets, CDI spec, labels, Events, GPU metrics), 0 on standby beside "
            "another pod of the plugin during an update",
            value=float(self._acting()),
        )
