"""What telemetry is about, as plain data: one chip's figures, and who holds each chip.

The hardware backends produce ChipSamples, the pod-resources client PodRefs and Holdings; the rules here turn
those into each chip's Holders (through the device plugin's devices, or through DRA claims); the Prometheus
collector (telemetry/collector.py) and the `list` tool read them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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


@dataclass(frozen=True)
class Holder:
    """A container holding a chip: its pod's and, on a DRA node, the claim it holds the chip through and the share
    of a shared device ("" where it holds the device whole, or not through a claim)."""

    pod: PodRef
    claim_namespace: str = ""
    claim_name: str = ""
    share_id: str = ""


@dataclass(frozen=True)
class ClaimDevice:
    """One device a container has from a ResourceClaim, as the kubelet's pod-resources API reports it."""

    pod: PodRef
    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    share_id: str = ""


@dataclass(frozen=True)
class Holdings:
    """What the kubelet says the node's containers hold: the device plugins' devices (resource name, device ID,
    container) and the devices of ResourceClaims."""

    devices: tuple[tuple[str, str, PodRef], ...] = ()
    claims: tuple[ClaimDevice, ...] = ()


ChipHolders = Mapping[str, tuple[Holder, ...]]  # chip UUID -> the containers holding it


def plugin_holders(plan: Plan, allocations: Mapping[str, PodRef]) -> dict[str, tuple[Holder, ...]]:
    """Chip UUID -> the container holding it on a device-plugin node: one per chip, as `chip_pods` picks it."""
    return {uuid: (Holder(ref),) for uuid, ref in chip_pods(plan, allocations).items()}


def claim_holders(
    holdings: Holdings, driver: str, pool: str, device_chips: Mapping[str, Sequence[str]], plugin_plan: Plan
) -> dict[str, tuple[Holder, ...]]:
    """Chip UUID -> every container holding it on a DRA node, in a stable order.

    A container holds a chip through a device of a claim of driver in pool (device_chips names each device's
    chips: a board's device holds both), or through a device the device plugin gave it before the node moved
    to DRA (plugin_plan: the node as the plugin would plan it; a pod keeps its chips across the move). One
    container holding a chip twice (two shares, or a claim listed twice) is one holder per claim and share.
    """
    found: dict[str, set[Holder]] = {}
    for claim in holdings.claims:
        if claim.driver != driver or claim.pool != pool:
            continue
        holder = Holder(claim.pod, claim.claim_namespace, claim.claim_name, claim.share_id)
        _add(found, device_chips.get(claim.device, ()), holder)
    allocations = {device_id: ref for _, device_id, ref in holdings.devices}
    for device_id, ref in allocations.items():
        device = plugin_plan.by_id.get(device_id)
        if device is not None:
            _add(found, (chip.uuid for chip in device.chips), Holder(ref))
    return {uuid: tuple(sorted(holders, key=_order)) for uuid, holders in found.items()}


def _add(found: dict[str, set[Holder]], uuids: Iterable[str], holder: Holder) -> None:
    for uuid in uuids:
        found.setdefault(uuid, set()).add(holder)


def _order(holder: Holder) -> tuple[str, ...]:
    ref = holder.pod
    return (ref.namespace, ref.pod, ref.container, holder.claim_namespace, holder.claim_name, holder.share_id)
