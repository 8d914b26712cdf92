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

import re
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
# What the kubelet may name: a claim UID becomes part of file and CDI device names, so it is checked first.
_UID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,126}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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


def check_ref(ref: ClaimRef) -> None:
    """Refuse a claim whose UID, namespace or name is not what Kubernetes allows (before it names a file)."""
    if not _UID.match(ref.uid):
        raise ClaimError(f"claim {ref.namespace[:64]}/{ref.name[:64]}: invalid UID {ref.uid[:80]!r}")
    if not _DNS_LABEL.match(ref.namespace):
        raise ClaimError(f"claim {ref.uid}: invalid namespace {ref.namespace[:80]!r}")
    if not _DNS_SUBDOMAIN.match(ref.name):
        raise ClaimError(f"claim {ref.uid}: invalid name {ref.name[:80]!r}")


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated chip of a prepared claim, with what the kubelet was told about it.

    admin: allocated with adminAccess (a monitoring claim): prepared beside the claim that holds the chip,
    and holding it for nobody.
    """

    requests: tuple[str, ...]
    pool: str
    device: str
    uuid: str
    cdi_ids: tuple[str, ...]
    admin: bool = False


@dataclass(frozen=True)
class PreparedClaim:
    """A claim whose CDI spec is written: its chips, and the spec document.

    complete is False for a claim rebuilt from its CDI spec after the checkpoint was lost: it holds its chips,
    but what the kubelet was told (requests, namespace, name) is not known, so a prepare reads it again.
    """

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    spec: Mapping[str, Any]
    complete: bool = True

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


@dataclass(frozen=True)
class Result:
    """One device of a claim's allocation for this driver."""

    request: str
    device: str
    admin: bool = False


def allocated(claim: Any, ref: ClaimRef, pool: str) -> list[Result]:
    """The results of claim's allocation for this driver; ClaimError when it is not ours or not well formed."""
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
    return [Result(str(r.get("request", "")), str(r.get("device", "")), r.get("adminAccess") is True) for r in ours]


def _mapping(value: Any, ref: ClaimRef, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ClaimError(f"claim {ref}: {what} is not an object")
    return value


def prepare(
    ref: ClaimRef,
    claim: Any,
    devices: Mapping[str, SliceDevice],
    holders: Mapping[str, ClaimRef],
    pool: str,
    control_nodes: tuple[str, ...],
    dev_root: Path,
) -> PreparedClaim:
    """The prepared claim for claim; ClaimError for a device unknown, unhealthy or held by another claim.

    holders maps a chip UUID to the claim it is prepared for now (other claims only). A device allocated with
    adminAccess is prepared whoever holds it, and even when it is unhealthy (a monitoring pod looks at it).
    """
    wanted: dict[str, list[Result]] = {}
    for result in allocated(claim, ref, pool):
        wanted.setdefault(result.device, []).append(result)
    chosen: list[SliceDevice] = []
    for name, results in wanted.items():
        device = devices.get(name)
        if device is None:
            raise ClaimError(f"claim {ref}: device {name[:80]!r} is not on this node (pool {pool})")
        if all(result.admin for result in results):
            chosen.append(device)
            continue
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
            tuple(result.request for result in wanted[d.name]),
            pool,
            d.name,
            d.chip.uuid,
            (f"{CLAIM_CDI_KIND}={cdi_device_name(ref.uid, d.name)}",),
            admin=all(result.admin for result in wanted[d.name]),
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
    """Which claim each prepared chip is held by, by chip UUID (admin-access devices hold nothing)."""
    return {d.uuid: claim.ref for claim in claims.values() for d in claim.devices if not d.admin}


def claim_from_spec(uid: str, spec: Any, pool: str) -> PreparedClaim | None:
    """The claim a CDI spec written by this driver describes (incomplete: see PreparedClaim), None if not ours."""
    if not isinstance(spec, dict) or spec.get("kind") != CLAIM_CDI_KIND or not isinstance(spec.get("devices"), list):
        return None
    edits = spec.get("containerEdits") if isinstance(spec.get("containerEdits"), dict) else {}
    env = [item for item in edits.get("env") or [] if isinstance(item, str)]
    visible = next((item.partition("=")[2] for item in env if item.startswith(f"{VISIBLE_DEVICES_ENV}=")), "")
    uuids = visible.split(",") if visible else []
    names = [entry.get("name") for entry in spec["devices"] if isinstance(entry, dict)]
    prefix = f"{uid}-"
    if len(names) != len(uuids) or not all(isinstance(n, str) and n.startswith(prefix) for n in names):
        return None
    devices = tuple(
        PreparedDevice((), pool, name.removeprefix(prefix), uuid, (f"{CLAIM_CDI_KIND}={name}",))
        for name, uuid in zip(names, uuids, strict=True)
    )
    return PreparedClaim(ClaimRef("", "", uid), devices, spec, complete=False)
