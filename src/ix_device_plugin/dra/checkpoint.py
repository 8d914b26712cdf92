"""The DRA driver's checkpoint: every prepared claim with its devices and CDI spec, as JSON, versioned.

It lives in the driver's directory under the kubelet's plugins directory, which survives a reboot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ix_device_plugin.dra.claims import ClaimRef, PreparedClaim, PreparedDevice
from ix_device_plugin.dra.slices import DRIVER

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_VERSION = 1


class CheckpointError(Exception):
    """The checkpoint file cannot be read; the message names the file and the problem."""


def checkpoint_text(claims: Mapping[str, PreparedClaim]) -> str:
    """The checkpoint file's text: version and every prepared claim by UID (with its CDI spec)."""
    entries = {
        uid: {
            "namespace": claim.ref.namespace,
            "name": claim.ref.name,
            "devices": [asdict(device) for device in claim.devices],
            "spec": claim.spec,
        }
        for uid, claim in sorted(claims.items())
    }
    return json.dumps({"version": CHECKPOINT_VERSION, "driver": DRIVER, "claims": entries}, indent=1) + "\n"


def parse_checkpoint(text: str, origin: str) -> dict[str, PreparedClaim]:
    """The prepared claims in a checkpoint's text; CheckpointError naming origin and the problem."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise CheckpointError(f"{origin}: not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("version") != CHECKPOINT_VERSION:
        version = document.get("version") if isinstance(document, dict) else None
        raise CheckpointError(f"{origin}: unsupported checkpoint version {version!r} (expected {CHECKPOINT_VERSION})")
    entries = document.get("claims")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{origin}: `claims` must be an object")
    return {str(uid): _claim_from(uid, entry, origin) for uid, entry in entries.items()}


def _claim_from(uid: str, entry: Any, origin: str) -> PreparedClaim:
    where = f"{origin}: claims.{uid}"
    try:
        ref = ClaimRef(str(entry["namespace"]), str(entry["name"]), uid)
        devices = tuple(
            PreparedDevice(
                tuple(str(r) for r in device["requests"]),
                str(device["pool"]),
                str(device["device"]),
                str(device["uuid"]),
                tuple(str(i) for i in device["cdi_ids"]),
            )
            for device in entry["devices"]
        )
        spec = entry["spec"]
        if not isinstance(spec, dict):
            raise TypeError("spec is not an object")
    except (KeyError, TypeError) as error:
        raise CheckpointError(f"{where}: malformed entry ({type(error).__name__}: {error})") from None
    return PreparedClaim(ref, devices, spec)


def read_checkpoint(path: Path) -> dict[str, PreparedClaim]:
    """The prepared claims in the checkpoint at path (none when there is no file); raises CheckpointError."""
    try:
        return parse_checkpoint(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise CheckpointError(f"{path}: {error.strerror or error}") from None
