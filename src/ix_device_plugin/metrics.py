"""Prometheus metrics of the plugin, in a registry of its own."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from ix_device_plugin import __version__
from ix_device_plugin.inventory import HEALTH_ERROR_NAMES, Inventory
from ix_device_plugin.plan import Plan

PREFIX = "ix_device_plugin"
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class Metrics:
    """Every metric the plugin exports; one instance per process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Info(f"{PREFIX}_build", "Build of the plugin", registry=r)
        self.build_info.info({"version": __version__})
        self.devices = Gauge(
            f"{PREFIX}_devices",
            "Devices advertised to the kubelet, by health",
            ["resource", "health"],
            registry=r,
        )
        self.chip_errors = Gauge(
            f"{PREFIX}_chip_health_errors", "Chips reporting each IXML health error", ["error"], registry=r
        )
        self.chips = Gauge(f"{PREFIX}_chips", "Chips found on the node, by state", ["state"], registry=r)
        self.registrations = Counter(f"{PREFIX}_registrations", "Successful registrations with the kubelet", registry=r)
        self.registration_failures = Counter(
            f"{PREFIX}_registration_failures", "Failed registration attempts", registry=r
        )
        self.reregistrations = Counter(
            f"{PREFIX}_reregistrations", "Registrations after a kubelet restart or lost socket", registry=r
        )
        self.registered = Gauge(f"{PREFIX}_registered", "1 while registered with the kubelet", registry=r)
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
        for error in HEALTH_ERROR_NAMES:
            self.chip_errors.labels(error=error).set(0)
        for method in ("Allocate", "GetPreferredAllocation"):
            self.calls.labels(method=method)
            self.call_latency.labels(method=method)

    def observe_call(self, method: str, seconds: float, error: str | None) -> None:
        """Record one gRPC call."""
        self.calls.labels(method=method).inc()
        self.call_latency.labels(method=method).observe(seconds)
        if error is not None:
            self.call_errors.labels(method=method, code=error).inc()

    def observe_plan(self, plan: Plan, inventory: Inventory) -> None:
        """Record what is advertised and how the chips are."""
        self.devices.clear()
        healthy = plan.healthy_count()
        self.devices.labels(resource=plan.resource_name, health="Healthy").set(healthy)
        self.devices.labels(resource=plan.resource_name, health="Unhealthy").set(plan.capacity() - healthy)
        counts = dict.fromkeys(HEALTH_ERROR_NAMES, 0)
        present = absent = 0
        for chip in inventory.chips():
            present += chip.status.present
            absent += not chip.status.present
            for error in chip.status.errors:
                counts[error] = counts.get(error, 0) + 1
        for error, count in counts.items():
            self.chip_errors.labels(error=error).set(count)
        self.chips.labels(state="present").set(present)
        self.chips.labels(state="absent").set(absent)

    def observe_health_poll(self) -> None:
        """Record a successful health poll."""
        self.last_health_poll.set(time.time())

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
