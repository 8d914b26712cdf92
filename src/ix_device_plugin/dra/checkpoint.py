"""The DRA driver's checkpoint: every prepared claim with its devices and CDI spec, as JSON, versioned.

It lives in the driver's directory under the kubelet's plugins directory, which survives a reboot, and records
the boot it was written in, so that claims from an earlier boot can be told apart. New fields are added
without a new version (older drivers ignore them); a version this driver does not know is refused, never
discarded, so that a rollback cannot forget the claims a newer driver prepared.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ix_device_plugin.dra.config import lenient
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim, PreparedDevice
from ix_device_plugin.dra.slices import BOARD, CHIP, DRIVER
from ix_device_plugin.settings.documents import DocumentError, Limits, load_json, read_file

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_VERSION = 1
LIMITS = Limits(max_bytes=4 * 1024 * 1024, max_depth=16, max_values=250_000)  # ~8,000 claims, ~40 MiB decoded


class CheckpointError(Exception):
    """The checkpoint file cannot be read; the message names the file and the problem."""


class CheckpointTooNew(CheckpointError):
    """The checkpoint was written by a newer driver: refused rather than discarded."""


@dataclass(frozen=True)
class Checkpoint:
    """The prepared claims by UID, and the boot they were written in."""

    boot_id: str = ""
    claims: Mapping[str, PreparedClaim] = field(default_factory=dict)


def checkpoint_text(claims: Mapping[str, PreparedClaim], boot_id: str = "") -> str:
    """The checkpoint file's text: version, boot and every prepared claim by UID (with its CDI spec)."""
    entries = {
        uid: {
            "namespace": claim.ref.namespace,
            "name": claim.ref.name,
            "devices": [asdict(device) for device in claim.devices],
            "spec": claim.spec,
            "complete": claim.complete,
        }
        for uid, claim in sorted(claims.items())
    }
    document = {"version": CHECKPOINT_VERSION, "driver": DRIVER, "bootID": boot_id, "claims": entries}
    return json.dumps(document, indent=1) + "\n"


def parse_checkpoint(data: bytes | str, origin: str) -> Checkpoint:
    """The checkpoint in data; CheckpointError (CheckpointTooNew for a newer version) naming origin and why."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        document = load_json(raw, LIMITS)
    except DocumentError as error:
        raise CheckpointError(f"{origin}: {error}") from None
    if not isinstance(document, dict):
        raise CheckpointError(f"{origin}: not a checkpoint (expected a JSON object)")
    version = document.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > CHECKPOINT_VERSION:
        raise CheckpointTooNew(
            f"{origin}: checkpoint version {version} was written by a newer driver (this one reads up to "
            f"{CHECKPOINT_VERSION}); refusing to start rather than forget its claims: run the newer driver, or "
            "unprepare its claims first"
        )
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"{origin}: unsupported checkpoint version {str(version)[:40]}")
    entries = document.get("claims")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{origin}: `claims` must be an object")
    boot_id = document.get("bootID")
    claims = {str(uid): _claim_from(str(uid), entry, origin) for uid, entry in entries.items()}
    return Checkpoint(boot_id if isinstance(boot_id, str) else "", claims)


def _claim_from(uid: str, entry: Any, origin: str) -> PreparedClaim:
    where = f"{origin}: claims.{uid[:80]}"
    try:
        ref = ClaimRef(str(entry["namespace"]), str(entry["name"]), uid)
        devices = tuple(_device_from(device) for device in entry["devices"])
        spec = entry["spec"]
        if not isinstance(spec, dict):
            raise TypeError("spec is not an object")
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"{where}: malformed entry ({type(error).__name__}: {error})") from None
    return PreparedClaim(ref, devices, spec, complete=entry.get("complete") is not False)


def _device_from(device: Any) -> PreparedDevice:
    """A device entry; the fields added since version 1 are read leniently (absent or malformed: the default)."""
    shares, slots, chips = device.get("shares"), device.get("slots"), device.get("chips")
    return PreparedDevice(
        tuple(str(r) for r in device["requests"]),
        str(device["pool"]),
        str(device["device"]),
        str(device["uuid"]),
        tuple(str(i) for i in device["cdi_ids"]),
        admin=device.get("admin") is True,
        share_id=device["share_id"] if isinstance(device.get("share_id"), str) else "",
        shares=shares if _integer(shares) and shares > 0 else 0,
        slots=tuple(s for s in slots if _integer(s)) if isinstance(slots, list) else (),
        chips=tuple(str(c) for c in chips) if isinstance(chips, list) else (),
        kind=device["kind"] if device.get("kind") in (CHIP, BOARD) else CHIP,
        config=lenient(device.get("config")),
    )


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint at path (None when there is no file); raises CheckpointError."""
    try:
        data = read_file(path, LIMITS.max_bytes, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except DocumentError as error:
        raise CheckpointError(f"{path}: {error}") from None
    return parse_checkpoint(data, str(path))
