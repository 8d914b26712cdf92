"""What telemetry is about, as plain data: one chip's figures, and the container holding a device.

The hardware backends produce ChipSamples, the pod-resources client PodRefs; the Prometheus collector
(telemetry/collector.py) and the `list` tool read both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ix_device_plugin.core.plan import Plan


@dataclass(frozen=True)
class ChipSample:
    """One chip's figures from one pass; None where the library has no answer."""

    temperature_c: float | None = None
    fan_speed: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    gpu_utilization: float | None = None
    mem_utilization: float | None = None
    mem_total_mib: float | None = None
    mem_used_mib: float | None = None
    mem_free_mib: float | None = None
    pcie_tx_kbps: float | None = None
    pcie_rx_kbps: float | None = None
    ecc_sbe_volatile: float | None = None  # 1 when single-bit errors occurred
    ecc_dbe_volatile: float | None = None  # 1 when double-bit errors occurred


@dataclass(frozen=True)
class PodRef:
    """The container that holds a device, as the kubelet's pod-resources API says."""

    namespace: str
    pod: str
    container: str


def chip_pods(plan: Plan, allocations: Mapping[str, PodRef]) -> dict[str, PodRef]:
    """Chip UUID -> the container holding it, from device ID -> container (replicas and boards resolved)."""
    pods: dict[str, PodRef] = {}
    for device_id, ref in allocations.items():
        device = plan.by_id.get(device_id)
        if device is not None:
            for chip in device.chips:
                pods.setdefault(chip.uuid, ref)
    return pods
