"""Per-chip GPU metrics with the names and labels of Iluvatar's ix-exporter, so its dashboards work unchanged.

A scrape only renders the last samples the sampler handed over. A value the library cannot give is absent from
that chip's series, never a made-up 0. Each chip has a series per container holding it (one with empty pod
labels while it is free); on a DRA node each series also says the claim, and the share, it is held through.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.products import full_name
from ix_device_plugin.core.telemetry import ChipHolders, ChipSample, Holder

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
CLAIM_LABELS = ("claim_namespace", "claim_name", "share_id")  # on a DRA node


def metric_families(
    samples: Mapping[str, ChipSample],
    inventory: Inventory,
    holders: ChipHolders,
    node_name: str,
    claims: bool = False,
) -> list[GaugeMetricFamily]:
    """The metric families for samples (chip UUID -> sample), labelled as ix-exporter labels them: a series per
    holder of each chip (holders: chip UUID -> the containers holding it), with CLAIM_LABELS when claims is set."""
    from prometheus_client.metrics_core import GaugeMetricFamily

    names = LABELS + CLAIM_LABELS if claims else LABELS
    families = {name: GaugeMetricFamily(name, help_text, labels=names) for name, help_text, _ in METRICS}
    for index, chip in enumerate(inventory.chips()):
        sample = samples.get(chip.uuid)
        if sample is None:
            continue
        chip_labels = [str(index), chip.uuid, full_name(chip.product), node_name]
        chip_labels.append(inventory.driver_version)
        for holder in holders.get(chip.uuid) or (None,):
            labels = chip_labels + _holder_labels(holder, claims)
            for name, _, field in METRICS:
                value = getattr(sample, field)
                if value is not None:
                    families[name].add_metric(labels, value)
    return [family for family in families.values() if family.samples]


def _holder_labels(holder: Holder | None, claims: bool) -> list[str]:
    if holder is None:
        return ["", "", "", *(["", "", ""] if claims else [])]
    ref = holder.pod
    pod = [ref.namespace, ref.pod, ref.container]
    return [*pod, holder.claim_namespace, holder.claim_name, holder.share_id] if claims else pod


@dataclass(frozen=True)
class _Snapshot:
    samples: Mapping[str, ChipSample]
    inventory: Inventory
    holders: ChipHolders


class TelemetryCollector:
    """Renders the last samples at scrape time; `update` replaces them whole. claims: label each series with the
    claim and share it is held through (a DRA node)."""

    def __init__(self, node_name: str, claims: bool = False) -> None:
        self.node_name = node_name
        self.claims = claims
        self._snapshot = _Snapshot({}, Inventory(), {})
        self._lock = threading.Lock()  # scrapes run on the probe server's loop, updates on the daemon's

    def update(self, samples: Mapping[str, ChipSample], inventory: Inventory, holders: ChipHolders) -> None:
        """Serve these samples from now on."""
        with self._lock:
            self._snapshot = _Snapshot(dict(samples), inventory, dict(holders))

    @property
    def samples(self) -> Mapping[str, ChipSample]:
        """The last samples, by chip UUID."""
        return self._snapshot.samples

    @property
    def holders(self) -> ChipHolders:
        """The containers holding chips, by chip UUID, as last seen."""
        return self._snapshot.holders

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshot = self._snapshot
        yield from metric_families(snapshot.samples, snapshot.inventory, snapshot.holders, self.node_name, self.claims)
