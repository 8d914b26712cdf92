"""A prepared claim as the driver keeps it: the claim's name, its devices and shares, and its CDI spec.

Plain data, shared by the pure cores (`claims.py` decides, `claimspec.py` writes the spec) and the state that
keeps them in the checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ix_device_plugin.dra.config import GpuConfig
from ix_device_plugin.dra.slices import CHIP

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
        if not self.name:  # rebuilt from its CDI spec: the name comes back with the next prepare
            return f"unnamed (uid {self.uid})"
        return f"{self.namespace}/{self.name} (uid {self.uid})"


def base_request(name: str) -> str:
    """The request a result's request names: `gpu` for `gpu` and for its subrequest `gpu/large` (a prioritized
    list's choice). Containers reference requests only, and the kubelet matches the names the driver answers
    exactly, so the answer names the request (upstream's kubelet-plugin helper strips subrequests the same way)."""
    return name.split("/", 1)[0]


def valid_uid(uid: str) -> bool:
    """True for a UID that may name a file (letters, digits and inner dashes: no `/`, no `..`)."""
    return _UID.match(uid) is not None


def check_ref(ref: ClaimRef) -> None:
    """Refuse a claim whose UID, namespace or name is not what Kubernetes allows (before it names a file)."""
    if not valid_uid(ref.uid):
        raise ClaimError(f"claim {ref.namespace[:64]}/{ref.name[:64]}: invalid UID {ref.uid[:80]!r}")
    if not _DNS_LABEL.match(ref.namespace):
        raise ClaimError(f"claim {ref.uid}: invalid namespace {ref.namespace[:80]!r}")
    if not _DNS_SUBDOMAIN.match(ref.name):
        raise ClaimError(f"claim {ref.uid}: invalid name {ref.name[:80]!r}")


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device of a prepared claim, with what the kubelet was told about it.

    admin: allocated with adminAccess (a monitoring claim): prepared beside the claim that holds the device,
    and holding it for nobody. share_id: the allocation's share of a shared device ("" held whole), which
    takes `shares` of the device's shares and is numbered `slots`. chips: the UUIDs of the chips a board
    device gives ((): the device is the chip `uuid`).
    """

    requests: tuple[str, ...]
    pool: str
    device: str
    uuid: str
    cdi_ids: tuple[str, ...]
    admin: bool = False
    share_id: str = ""
    shares: int = 0
    slots: tuple[int, ...] = ()
    chips: tuple[str, ...] = ()
    kind: str = CHIP
    config: GpuConfig = field(default_factory=GpuConfig)

    @property
    def request_refs(self) -> tuple[str, ...]:
        """The requests the device answers for, as containers reference them: subrequest names stripped."""
        return tuple(dict.fromkeys(base_request(name) for name in self.requests))

    @property
    def chip_uuids(self) -> tuple[str, ...]:
        """The UUIDs of the chips behind the device."""
        return self.chips or (self.uuid,)

    @property
    def replica_ids(self) -> tuple[str, ...]:
        """The device as the device plugin names replicas: `<uuid>::<slot>` per slot, or the UUID when held whole."""
        return tuple(f"{self.uuid}::{slot}" for slot in self.slots) if self.share_id else (self.uuid,)


@dataclass(frozen=True)
class PreparedClaim:
    """A claim whose CDI spec is written: its devices, and the spec document.

    complete is False for a claim rebuilt from its CDI spec after the checkpoint was lost: it holds its chips,
    but what the kubelet was told (requests, namespace, name) is not known, so a prepare reads it again.
    reset_pending: its config asks for a reset, which has not ended yet (it is recorded before it starts, so that
    a driver killed in the middle runs it at the kubelet's next try instead of answering without it).
    pod_claim: the pod-local name of a claim made from a template (None: made on its own), which names where its
    containers find their device metadata. metadata_generations: the last generation each of its metadata files
    (by request) was given, so that a file found torn after a restart never gets a number already used.
    """

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    spec: Mapping[str, Any]
    complete: bool = True
    reset_pending: bool = False
    pod_claim: str | None = None
    metadata_generations: Mapping[str, int] = field(default_factory=dict)

    @property
    def uuids(self) -> tuple[str, ...]:
        """The claim's chip UUIDs, in allocation order, each once."""
        return tuple(dict.fromkeys(uuid for device in self.devices for uuid in device.chip_uuids))

    @property
    def reset_chips(self) -> tuple[str, ...]:
        """The chips to reset before the claim's containers start (its config says reset: true)."""
        chips = (uuid for d in self.devices if d.config.resets and not d.admin for uuid in d.chip_uuids)
        return tuple(dict.fromkeys(chips))


def describe(claim: PreparedClaim) -> str:
    """The claim's devices for a log line: `gpu-0`, `board-2`, `gpu-1 share 2 of ... (slots 0,1)`."""
    parts = []
    for device in claim.devices:
        part = device.device
        if device.share_id:
            part += f" share {device.share_id} (slot {','.join(map(str, device.slots))})"
        parts.append(part + (" (admin access)" if device.admin else ""))
    return ", ".join(parts)
