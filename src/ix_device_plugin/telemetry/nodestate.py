"""The agent's view of the node at scrape time, the same in both front ends so that one dashboard reads both.

Its devices by health, the chips found and their health errors, and whether the kubelet has registered it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.settings.health import HEALTH_ERROR_NAMES

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

PREFIX = "ix_device_plugin"


@dataclass(frozen=True)
class Devices:
    """What the front end offers the kubelet: the resource (or DRA driver) name, its devices and how many are
    healthy."""

    resource: str
    total: int
    healthy: int


class NodeStateCollector:
    """`ix_device_plugin_devices{resource,health}`, `_chip_health_errors{error}`, `_chips{state}` and
    `_registered`, derived at scrape time from what the front end serves."""

    def __init__(
        self, devices: Callable[[], Devices], inventory: Callable[[], Inventory], registered: Callable[[], bool]
    ) -> None:
        self._devices = devices
        self._inventory = inventory
        self._registered = registered

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names are known only at collect time; nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import GaugeMetricFamily

        offered = self._devices()
        devices = GaugeMetricFamily(
            f"{PREFIX}_devices", "Devices advertised to the kubelet, by health", labels=["resource", "health"]
        )
        devices.add_metric([offered.resource, "Healthy"], offered.healthy)
        devices.add_metric([offered.resource, "Unhealthy"], offered.total - offered.healthy)
        yield devices
        errors = dict.fromkeys(HEALTH_ERROR_NAMES, 0)
        present = absent = 0
        for chip in self._inventory().chips():
            present += chip.status.present
            absent += not chip.status.present
            for error in chip.status.errors:
                errors[error] = errors.get(error, 0) + 1
        chip_errors = GaugeMetricFamily(
            f"{PREFIX}_chip_health_errors", "Chips reporting each IXML health error", labels=["error"]
        )
        for error, count in errors.items():
            chip_errors.add_metric([error], count)
        yield chip_errors
        chips = GaugeMetricFamily(f"{PREFIX}_chips", "Chips found on the node, by state", labels=["state"])
        chips.add_metric(["present"], present)
        chips.add_metric(["absent"], absent)
        yield chips
        yield GaugeMetricFamily(
            f"{PREFIX}_registered", "1 while registered with the kubelet", value=int(self._registered())
        )
