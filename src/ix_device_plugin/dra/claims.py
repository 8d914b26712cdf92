"""What preparing a ResourceClaim means for the driver: the claim's chips, their CDI spec, and the checkpoint.

Pure: a ResourceClaim object (a dict, as the API server returns it) and the slice devices in, plain data out.
`state.py` writes the spec and the checkpoint; the service answers the kubelet.

A claim's CDI spec is transient and its own (kind `gpu.iluvatar.com/claim`, file
`gpu.iluvatar.com-claim_<claim UID>.yaml`): a device `<claim UID>-<device>` per allocated chip with its device
node, and spec-wide edits every container of the claim gets (`/dev/itrctl`, `IX_VISIBLE_DEVICES` and the legacy
`ILUVATAR_COREX_VISIBLE_DEVICES` holding the claim's chip UUIDs). Its own kind keeps it apart from the device
plugin's node-wide `iluvatar.com/gpu` spec, so both modes can share a node while it moves from one to the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ix_device_plugin.core.allocation import LEGACY_VISIBLE_DEVICES_ENV, VISIBLE_DEVICES_ENV
from ix_device_plugin.core.cdi import build_spec, minimum_version
from ix_device_plugin.core.inventory import Board, Inventory
from ix_device_plugin.dra.slices import DRIVER, SliceDevice

CLAIM_CDI_VENDOR = DRIVER
CLAIM_CDI_CLASS = "claim"
CLAIM_CDI_KIND = f"{CLAIM_CDI_VENDOR}/{CLAIM_CDI_CLASS}"


class ClaimError(Exception):
    """This claim cannot be prepared; the message says which claim and why."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated chip of a prepared claim, with what the kubelet was told about it."""

    requests: tuple[str, ...]
    pool: str
    device: str
    uuid: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    """A claim whose CDI spec is written: its chips, and the spec document."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    spec: Mapping[str, Any]

    @property
    def uuids(self) -> tuple[str, ...]:
        """The claim's chip UUIDs, in allocation order, each once."""
        return tuple(dict.fromkeys(device.uuid for device in self.devices))


def cdi_spec_file(uid: str) -> str:
    """The claim's transient CDI spec file name (the CDI library's `<vendor>-<class>_<id>.yaml`)."""
    return f"{CLAIM_CDI_VENDOR}-{CLAIM_CDI_CLASS}_{uid}.yaml"


def cdi_device_name(uid: str, device: str) -> str:
    """The claim's CDI device name for one allocated device."""
    return f"{uid}-{device}"


def allocated(claim: Mapping[str, Any], ref: ClaimRef, pool: str) -> list[tuple[str, str]]:
    """(request, device) of each result of claim's allocation for this driver; ClaimError when it is not ours."""
    metadata = claim.get("metadata") or {}
    if metadata.get("uid") != ref.uid:
        raise ClaimError(f"claim {ref}: the API server has UID {metadata.get('uid')!r}: the claim was replaced")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"claim {ref}: not allocated (status.allocation is empty)")
    results = [r for r in (allocation.get("devices") or {}).get("results") or [] if r.get("driver") == DRIVER]
    if not results:
        raise ClaimError(f"claim {ref}: no device of its allocation is from driver {DRIVER}")
    elsewhere = sorted({str(r.get("pool")) for r in results if r.get("pool") != pool})
    if elsewhere:
        raise ClaimError(f"claim {ref}: allocated from pool {', '.join(elsewhere)}, not this node's pool {pool}")
    return [(str(r.get("request", "")), str(r.get("device", ""))) for r in results]


def prepare(
    ref: ClaimRef,
    claim: Mapping[str, Any],
    devices: Mapping[str, SliceDevice],
    holders: Mapping[str, ClaimRef],
    pool: str,
    control_nodes: tuple[str, ...],
    dev_root: Path,
) -> PreparedClaim:
    """The prepared claim for claim; ClaimError for a device unknown, unhealthy or held by another claim.

    holders maps a chip UUID to the claim it is prepared for now (other claims only).
    """
    wanted: dict[str, list[str]] = {}
    for request, name in allocated(claim, ref, pool):
        wanted.setdefault(name, []).append(request)
    chosen: list[SliceDevice] = []
    for name in wanted:
        device = devices.get(name)
        if device is None:
            raise ClaimError(f"claim {ref}: device {name!r} is not on this node (pool {pool})")
        if not device.healthy:
            raise ClaimError(
                f"claim {ref}: device {name} ({device.chip.uuid}) is unhealthy: {', '.join(device.reasons)}"
            )
        holder = holders.get(device.chip.uuid)
        if holder is not None and holder.uid != ref.uid:
            raise ClaimError(f"claim {ref}: device {name} ({device.chip.uuid}) is prepared for claim {holder}")
        chosen.append(device)
    spec = claim_spec(ref.uid, chosen, control_nodes, dev_root)
    prepared = tuple(
        PreparedDevice(
            tuple(wanted[d.name]), pool, d.name, d.chip.uuid, (f"{CLAIM_CDI_KIND}={cdi_device_name(ref.uid, d.name)}",)
        )
        for d in chosen
    )
    return PreparedClaim(ref, prepared, spec)


def claim_spec(uid: str, devices: list[SliceDevice], control_nodes: tuple[str, ...], dev_root: Path) -> dict[str, Any]:
    """The claim's CDI spec document: the node-wide spec of its chips, renamed to the claim, plus its env."""
    chips = tuple(device.chip for device in devices)
    inventory = (
        Inventory(boards=(Board(product="claim", chips=chips),), control_nodes=control_nodes) if chips else Inventory()
    )
    document = build_spec(inventory, dev_root).document
    by_uuid = {device.chip.uuid: device.name for device in devices}
    renamed = [
        {**entry, "name": cdi_device_name(uid, by_uuid[entry["name"]])}
        for entry in document["devices"]
        if entry["name"] in by_uuid
    ]
    visible = ",".join(device.chip.uuid for device in devices)
    edits = dict(document.get("containerEdits") or {})
    edits["env"] = [f"{VISIBLE_DEVICES_ENV}={visible}", f"{LEGACY_VISIBLE_DEVICES_ENV}={visible}"]
    spec: dict[str, Any] = {"cdiVersion": "", "kind": CLAIM_CDI_KIND, "devices": renamed, "containerEdits": edits}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def holders(claims: Mapping[str, PreparedClaim]) -> dict[str, ClaimRef]:
    """Which claim each prepared chip is held by, by chip UUID."""
    return {uuid: claim.ref for claim in claims.values() for uuid in claim.uuids}
