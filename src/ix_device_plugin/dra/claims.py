"""What preparing a ResourceClaim means for the driver: the claim's devices, their shares, and its settings.

Pure: a ResourceClaim object (a dict, as the API server returns it), the slice devices and the claims prepared
already in, plain data out. `claimspec.py` makes the claim's CDI spec, `state.py` writes it and the checkpoint.

A device is a chip or a whole board, held whole or, where the node shares its devices, as a share (the
allocation's `shareID`, taking the `shares` it consumed). No chip is held whole by one claim and by another in
any way, and the shares of one device never add up to more than it has; each share gets numbered slots on its
device (`<uuid>::<slot>` in IX_REPLICA_DEVICES, as the device plugin numbers replicas). A device out of service
(tainted in the slice) is given only to a claim whose allocation tolerates its taints (`tolerations.py`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ix_device_plugin.dra.claimspec import cdi_id, claim_spec
from ix_device_plugin.dra.config import (
    MAX_SHARES,
    ConfigEntry,
    ConfigError,
    GpuConfig,
    allocation_configs,
    config_for,
)
from ix_device_plugin.dra.metadata import check_request, pod_claim_name, requests_of, with_mount_ids
from ix_device_plugin.dra.pool import quantity
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef, PreparedClaim, PreparedDevice
from ix_device_plugin.dra.slices import CHIP, DRIVER, SHARES, SliceDevice, device_taints
from ix_device_plugin.dra.tolerations import Toleration, read_tolerations, taint_text, untolerated

SHARE_ID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class NodeView:
    """What a prepare needs to know of the node: its slice devices, pool, control nodes and /dev."""

    devices: Mapping[str, SliceDevice]
    pool: str
    control_nodes: tuple[str, ...] = ()
    dev_root: Path = Path("/")


@dataclass(frozen=True)
class Result:
    """One device of a claim's allocation for this driver (shares: what a share consumed, 0 when held whole;
    tolerations: its request's, copied at allocation)."""

    request: str
    device: str
    admin: bool = False
    share_id: str = ""
    shares: int = 0
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True)
class Holding:
    """A claim's hold on a chip: through which device, and how many of its shares (0: whole)."""

    ref: ClaimRef
    device: str
    shares: int


def allocated(claim: Any, ref: ClaimRef, pool: str) -> tuple[list[Result], list[ConfigEntry]]:
    """The results of claim's allocation for this driver and its GpuConfigs; ClaimError when it is not ours or
    not well formed."""
    metadata = _mapping(_mapping(claim, ref, "the claim").get("metadata"), ref, "metadata")
    if metadata.get("uid") != ref.uid:
        other = str(metadata.get("uid"))[:80]
        raise ClaimError(f"claim {ref}: the API server has UID {other!r}: the claim was replaced")
    status = _mapping(claim.get("status"), ref, "status")
    allocation = _mapping(status.get("allocation"), ref, "status.allocation")
    if not allocation:
        raise ClaimError(f"claim {ref}: not allocated (status.allocation is empty)")
    devices = _mapping(allocation.get("devices"), ref, "status.allocation.devices")
    listed = devices.get("results") or []
    if not isinstance(listed, list):
        raise ClaimError(f"claim {ref}: status.allocation.devices.results is not a list")
    results = [_mapping(r, ref, "a result") for r in listed]
    ours = [r for r in results if r.get("driver") == DRIVER]
    if not ours:
        raise ClaimError(f"claim {ref}: no device of its allocation is from driver {DRIVER}")
    elsewhere = sorted({str(r.get("pool"))[:80] for r in ours if r.get("pool") != pool})
    if elsewhere:
        raise ClaimError(f"claim {ref}: allocated from pool {', '.join(elsewhere)}, not this node's pool {pool}")
    try:
        configs = allocation_configs(devices, "status.allocation.devices")
    except ConfigError as error:
        raise ClaimError(f"claim {ref}: {error}") from None
    return [_result(r, ref) for r in ours], configs


def _result(result: dict[str, Any], ref: ClaimRef) -> Result:
    request, device = str(result.get("request", "")), str(result.get("device", ""))
    tolerations = read_tolerations(result.get("tolerations"), f"claim {ref}: device {device[:80]!r}")
    admin = result.get("adminAccess") is True
    share_id = result.get("shareID")
    if share_id is None:
        return Result(request, device, admin, tolerations=tolerations)
    if not isinstance(share_id, str) or not SHARE_ID.match(share_id):
        raise ClaimError(f"claim {ref}: device {device[:80]!r}: shareID {str(share_id)[:80]!r} is not a UUID")
    consumed = _mapping(result.get("consumedCapacity"), ref, f"device {device[:80]!r}: consumedCapacity")
    value = consumed.get(SHARES, consumed.get(f"{DRIVER}/{SHARES}"))
    shares = 1 if value is None else _shares(value)
    if shares is None:
        raise ClaimError(
            f"claim {ref}: device {device[:80]!r}: consumedCapacity {SHARES} {str(value)[:40]!r} is not a whole "
            f"number of shares from 1 to {MAX_SHARES}"
        )
    return Result(request, device, admin, share_id.lower(), shares, tolerations)


def _shares(value: Any) -> int | None:
    """The shares a consumedCapacity quantity takes; None when it is not a whole number from 1 to MAX_SHARES.
    Bounded before any conversion: a quantity such as `1e10000000` is valid, and int() of it would take hours."""
    number = quantity(value) if isinstance(value, str) else None
    if number is None or not 1 <= number <= MAX_SHARES or number != number.to_integral_value():
        return None
    return int(number)


def _mapping(value: Any, ref: ClaimRef, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ClaimError(f"claim {ref}: {what} is not an object")
    return value


def holdings(claims: Mapping[str, PreparedClaim]) -> dict[str, list[Holding]]:
    """Every chip's holds by the prepared claims, by chip UUID (admin-access devices hold nothing)."""
    held: dict[str, list[Holding]] = {}
    for claim in claims.values():
        for device in claim.devices:
            if device.admin:
                continue
            for uuid in device.chip_uuids:
                held.setdefault(uuid, []).append(Holding(claim.ref, device.device, device.shares))
    return held


def slots_in_use(claims: Mapping[str, PreparedClaim]) -> dict[str, set[int]]:
    """The numbered shares each device has given to the prepared claims, by device name."""
    used: dict[str, set[int]] = {}
    for claim in claims.values():
        for device in claim.devices:
            used.setdefault(device.device, set()).update(device.slots)
    return used


def prepare(
    ref: ClaimRef, claim: Any, node: NodeView, others: Mapping[str, PreparedClaim], again: bool = False
) -> PreparedClaim:
    """The prepared claim for claim; ClaimError for a device unknown, gone (a chip not enumerated, its device node
    missing), out of service (unhealthy: tainted in the slice) unless its allocation result tolerates every taint it
    carries now, held by another claim in a way that excludes this one, or configured in a way the device does not
    allow. A device that broke after the allocation, or was allocated from a slice nobody updated (the kubelet keeps
    a gone driver's slices for a while), waits until the chip is back in service: the kubelet tries again.

    others: the claims prepared now, this one aside. A device allocated with adminAccess is prepared whoever
    holds it, under the same rule of health. again: the claim was prepared before (rebuilt from its CDI spec):
    its devices are its own whatever their health now, as they are for a claim answered from the checkpoint.
    """
    results, configs = allocated(claim, ref, node.pool)
    groups: dict[tuple[str, str], list[Result]] = {}
    for result in results:
        groups.setdefault((result.device, result.share_id), []).append(result)
    held = holdings(others)
    slots = slots_in_use(others)
    asked: dict[str, int] = {}  # this claim's shares by device
    for (name, _), group in groups.items():
        asked[name] = asked.get(name, 0) + group[0].shares
    prepared: list[tuple[PreparedDevice, SliceDevice]] = []
    for (name, share_id), group in groups.items():
        device = node.devices.get(name)
        if device is None:
            raise ClaimError(f"claim {ref}: device {name[:80]!r} is not on this node (pool {node.pool})")
        requests = tuple(result.request for result in group)
        config = config_for(requests, configs)
        admin = all(result.admin for result in group)
        shares = group[0].shares
        _check_present(ref, device)
        if not again:
            _check_in_service(ref, device, group)
        if not admin:
            _check(ref, device, share_id, shares, asked[name], config, held)
        taken = sorted(slots.setdefault(name, set()))
        numbered = _free_slots(taken, shares, device.shares) if share_id and not admin else ()
        slots[name].update(numbered)
        entry = PreparedDevice(
            requests,
            node.pool,
            name,
            device.uuid,
            (cdi_id(ref.uid, name, share_id),),
            admin=admin,
            share_id=share_id,
            shares=shares,
            slots=numbered,
            chips=tuple(chip.uuid for chip in device.chips) if device.kind != CHIP else (),
            kind=device.kind,
            config=config,
        )
        prepared.append((entry, device))
    spec = claim_spec(ref.uid, prepared, node.control_nodes, node.dev_root)
    devices = tuple(entry for entry, _ in prepared)
    for request in requests_of(devices):
        check_request(ref, request)
    devices = tuple(with_mount_ids(ref, list(devices)))
    return PreparedClaim(ref, devices, spec, pod_claim=pod_claim_name(claim, ref))


def check_not_reserved(prepared: PreparedClaim, reserved: Mapping[str, str]) -> None:
    """ClaimError when a chip of prepared is reserved for a reset (reserved: chip UUID -> why, by any pod of the
    agent), admin access included (the reset would pull the chip from under its container). Asked under the
    claims' lock."""
    for device in prepared.devices:
        busy = [uuid for uuid in device.chip_uuids if uuid in reserved]
        if busy:
            raise ClaimError(
                f"claim {prepared.ref}: device {device.device} ({', '.join(busy)}) is {reserved[busy[0]]} "
                "(self-healing clears an error on it); the kubelet tries again"
            )


def _check_present(ref: ClaimRef, device: SliceDevice) -> None:
    """ClaimError when a chip of the device cannot be handed to a container now (gone from enumeration, its device
    node missing): the runtime could not create the container, whatever the claim tolerates."""
    for chip in device.chips:
        why = chip.status.absence()
        if why is not None:
            raise ClaimError(
                f"claim {ref}: device {device.name} ({chip.uuid}) cannot be given to a container now: {why}; "
                "the kubelet tries again"
            )


def _check_in_service(ref: ClaimRef, device: SliceDevice, group: list[Result]) -> None:
    """ClaimError when device is out of service and a result of the group does not tolerate every taint it
    carries now (where the API server keeps no device taints, the device was left out of the slice and no
    result carries tolerations: it is refused)."""
    taints = device_taints(device)
    missing = next((left for result in group if (left := untolerated(taints, result.tolerations))), [])
    if not missing:
        return
    uuids = ", ".join(chip.uuid for chip in device.chips)
    healing = f" (self-healing: {device.healing})" if device.healing else ""
    raise ClaimError(
        f"claim {ref}: device {device.name} ({uuids}) is out of service: {', '.join(device.reasons)}{healing}; "
        f"its allocation does not tolerate the taint {taint_text(missing[0])}, so it is prepared once the chip is "
        "back in service (healed by a reset or returned by an operator); the kubelet tries again"
    )


def _check(
    ref: ClaimRef,
    device: SliceDevice,
    share_id: str,
    shares: int,
    asked: int,
    config: GpuConfig,
    held: Mapping[str, list[Holding]],
) -> None:
    """ClaimError when device cannot be prepared for this claim as allocated and configured."""
    name = device.name
    if share_id and device.shares < 2:
        raise ClaimError(
            f"claim {ref}: device {name} was allocated as a share, but it is not shared on this node now "
            "(sharing.timeSlicing.replicas in the driver's ix-config)"
        )
    if share_id and shares > device.shares:
        raise ClaimError(
            f"claim {ref}: device {name}: consumedCapacity {SHARES} {shares} is more than the {device.shares} "
            "shares the device has"
        )
    sharers: list[Holding] = []
    for chip in device.chips:
        for holding in held.get(chip.uuid, []):
            if holding.ref.uid == ref.uid:
                continue
            if holding.shares == 0 or not share_id or holding.device != name:
                part = "" if holding.device == name else f" as part of {holding.device}"
                raise ClaimError(f"claim {ref}: device {name} ({chip.uuid}) is prepared for claim {holding.ref}{part}")
            sharers.append(holding)
    taken = {(h.ref.uid, h.device): h for h in sharers}.values()  # a board's shares count once, not per chip
    used = sum(h.shares for h in taken)
    if share_id and used + asked > device.shares:
        owners = ", ".join(sorted({str(h.ref) for h in taken}))
        held = f"{used} are prepared for {owners}, " if owners else ""
        raise ClaimError(f"claim {ref}: device {name} has {device.shares} shares: {held}this claim asks for {asked}")
    if config.shares is not None:
        if device.shares < 2:
            raise ClaimError(
                f"claim {ref}: GpuConfig sharing.shares: device {name} is not shared on this node "
                "(sharing.timeSlicing.replicas in the driver's ix-config)"
            )
        if config.shares != shares:
            raise ClaimError(
                f"claim {ref}: GpuConfig sharing.shares is {config.shares}, but {name} was allocated with "
                f"{shares or device.shares} shares: ask for them in the request "
                f"(capacity.requests.{SHARES}: {config.shares})"
            )
    if config.resets and taken:
        owners = ", ".join(sorted({str(h.ref) for h in taken}))
        raise ClaimError(
            f"claim {ref}: GpuConfig reset: {name} is shared with {owners}; a reset would stop their containers"
        )


def _free_slots(taken: list[int], count: int, total: int) -> tuple[int, ...]:
    """The lowest count slot numbers not taken (numbers past total only when the device's count shrank)."""
    free = [slot for slot in range(max(total, len(taken) + count)) if slot not in taken]
    return tuple(free[:count])
