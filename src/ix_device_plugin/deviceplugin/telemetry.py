"""Per-chip GPU metrics with the names and labels of Iluvatar's ix-exporter, so its dashboards work unchanged.

Values are sampled in the background (one backend pass for every chip); a scrape only renders the last
samples. A value the library cannot give is absent from that chip's series, never a made-up 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.labels import product_model
from ix_device_plugin.core.plan import Plan
from ix_device_plugin.core.telemetry import ChipSample, PodRef, chip_pods
from ix_device_plugin.hardware.backend import Backend, BackendError
from ix_device_plugin.hardware.worker import BackendTimeout, Hardware
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from prometheus_client.metrics_core import GaugeMetricFamily, Metric

# (ix-exporter's metric name, its help, the ChipSample field)
METRICS: tuple[tuple[str, str, str], ...] = (
    ("ix_gpu_temperature", "GPU temperature of iluvatar GPU (C).", "temperature_c"),
    ("ix_temperature", "Deprecated, use ix_gpu_temperature instead.", "temperature_c"),
    ("ix_fan_speed", "Fan speed of iluvatar GPU (RPM).", "fan_speed"),
    ("ix_power_usage", "Power usage of iluvatar GPU (W).", "power_w"),
    ("ix_sm_clock", "Sm clock of iluvatar GPU (MHz).", "sm_clock_mhz"),
    ("ix_mem_clock", "Mem clock of iluvatar GPU (MHz).", "mem_clock_mhz"),
    ("ix_gpu_utilization", "Utilization of iluvatar GPU (%).", "gpu_utilization"),
    ("ix_mem_utilization", "Memory utilization of iluvatar GPU (%).", "mem_utilization"),
    ("ix_mem_total", "Total physical memory of iluvatar GPU (MiB).", "mem_total_mib"),
    ("ix_mem_used", "Used physical memory of iluvatar GPU (MiB).", "mem_used_mib"),
    ("ix_mem_free", "Free physical memory of iluvatar GPU (MiB).", "mem_free_mib"),
    ("ix_pcie_tx_throughput", "PCIe tx (transmit) data including both header and payload (KB/s).", "pcie_tx_kbps"),
    ("ix_pcie_rx_throughput", "PCIe rx (read) data including both header and payload (KB/s).", "pcie_rx_kbps"),
    (
        "ix_ecc_sbe_vol_status",
        "Single-bit volatile ecc errors status. if the value is 1, errors occurred, otherwise, no errors.",
        "ecc_sbe_volatile",
    ),
    (
        "ix_ecc_dbe_vol_status",
        "Double-bit volatile ecc errors status. if the value is 1, errors occurred, otherwise, no errors.",
        "ecc_dbe_volatile",
    ),
)
METRIC_NAMES = tuple(name for name, _, _ in METRICS)
LABELS = ("gpu", "uuid", "name", "node_name", "driver", "namespace", "pod", "container")


def metric_families(
    samples: Mapping[str, ChipSample],
    inventory: Inventory,
    pods: Mapping[str, PodRef],
    node_name: str,
) -> list[GaugeMetricFamily]:
    """The metric families for samples (chip UUID -> sample), labelled as ix-exporter labels them."""
    from prometheus_client.metrics_core import GaugeMetricFamily

    families = {name: GaugeMetricFamily(name, help_text, labels=LABELS) for name, help_text, _ in METRICS}
    for index, chip in enumerate(inventory.chips()):
        sample = samples.get(chip.uuid)
        if sample is None:
            continue
        ref = pods.get(chip.uuid)
        labels = [
            str(index),
            chip.uuid,
            f"Iluvatar {product_model(chip.product)}",
            node_name,
            inventory.driver_version,
            ref.namespace if ref else "",
            ref.pod if ref else "",
            ref.container if ref else "",
        ]
        for name, _, field in METRICS:
            value = getattr(sample, field)
            if value is not None:
                families[name].add_metric(labels, value)
    return [family for family in families.values() if family.samples]


@dataclass(frozen=True)
class _Snapshot:
    samples: Mapping[str, ChipSample]
    inventory: Inventory
    pods: Mapping[str, PodRef]


class TelemetryCollector:
    """Renders the last samples at scrape time; `update` replaces them whole."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._snapshot = _Snapshot({}, Inventory(), {})
        self._lock = threading.Lock()  # scrapes run on the probe server's loop, updates on the daemon's

    def update(self, samples: Mapping[str, ChipSample], inventory: Inventory, pods: Mapping[str, PodRef]) -> None:
        """Serve these samples from now on."""
        with self._lock:
            self._snapshot = _Snapshot(dict(samples), inventory, dict(pods))

    @property
    def samples(self) -> Mapping[str, ChipSample]:
        """The last samples, by chip UUID."""
        return self._snapshot.samples

    @property
    def pods(self) -> Mapping[str, PodRef]:
        """The containers holding chips, by chip UUID, as last seen."""
        return self._snapshot.pods

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshot = self._snapshot
        yield from metric_families(snapshot.samples, snapshot.inventory, snapshot.pods, self.node_name)


Allocations = Callable[[], Awaitable[Mapping[str, PodRef]]]  # device ID -> the container holding it (empty: unknown)


class TelemetrySampler:
    """Samples every chip each interval and hands the figures, labelled with their pods, to the collector.

    hardware: a worker of telemetry's own, over a backend instance of its own, so that a read that hangs
    holds up neither health nor the liveness probe: the pass fails at its deadline, the worker gives up on it
    (at most MAX_ABANDONED times; each leaves a thread behind), and the next pass leaves that figure out.
    """

    MAX_ABANDONED = 8

    def __init__(
        self,
        hardware: Hardware,
        collector: TelemetryCollector,
        interval: float,
        served: Callable[[], tuple[Inventory, Plan]],
        allocations: Allocations,
    ) -> None:
        self._hardware = hardware
        self._collector = collector
        self._interval = interval
        self._served = served
        self._allocations = allocations
        self._turn = asyncio.Lock()  # a pass, or a pause

    async def run(self) -> None:
        """One pass per interval until cancelled; a failed pass is said once and leaves the last figures."""
        errors = OncePerError(log, logging.WARNING)
        while True:
            seen, _ = self._served()
            if seen.boards:
                try:
                    samples = await self._sample(seen)
                except BackendError as error:
                    errors.failed("telemetry pass failed: %s", self._given_up(error))
                else:
                    errors.succeeded("telemetry passes work again")
                    allocations = await self._allocations()
                    inventory, plan = self._served()
                    self._collector.update(samples, inventory, chip_pods(plan, allocations))
            await asyncio.sleep(self._interval)

    async def _sample(self, inventory: Inventory) -> Mapping[str, ChipSample]:
        async with self._turn:
            return await self._hardware.call("sample", lambda backend: backend.sample(inventory))

    def _given_up(self, error: BackendError) -> str:
        """Why the pass failed; a pass that hung is given up on, so that the next one runs."""
        if not isinstance(error, BackendTimeout):
            return str(error)
        if self._hardware.abandoned >= self.MAX_ABANDONED:
            return f"{error}; {self._hardware.abandoned} calls never returned, telemetry stops until a restart"
        self._hardware.abandon()
        return f"{error}; the next pass leaves out what it was reading"

    async def close(self, timeout: float) -> None:
        """Release telemetry's backend (not while a read hangs in it), within timeout."""
        await self._hardware.close(timeout)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """No pass while inside, and telemetry's hold on the GPU library released first (a GPU reset)."""
        async with self._turn:
            try:
                await self._hardware.call("release", _release)
            except BackendError as error:
                log.warning("telemetry could not release the GPU library before a reset: %s", error)
            yield


def _release(backend: Backend) -> None:
    backend.close()  # the next pass opens the library again
