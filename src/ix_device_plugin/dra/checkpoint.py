"""The DRA driver's checkpoint: every prepared claim with its devices and CDI spec, as JSON, versioned.

It lives in the driver's directory under the kubelet's plugins directory, which survives a reboot, and records
the boot it was written in, so that claims from an earlier boot can be told apart. New fields are added
without a new version: older drivers ignore them (and drop them when they write it again, so each has a meaning
when absent: `metadataGenerations`, absent, leaves the generations the files say). A version this driver does
not know is refused, never discarded, so that a rollback cannot forget the claims a newer driver prepared.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ix_device_plugin.dra.config import lenient
from ix_device_plugin.dra.metadata import MAX_GENERATION, valid_label
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim, PreparedDevice, valid_uid
from ix_device_plugin.dra.slices import BOARD, CHIP, DRIVER
from ix_device_plugin.settings.documents import DocumentError, Limits, kind_of, load_json, read_file
from ix_device_plugin.settings.yamlsafe import shown

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
            **({"resetPending": True} if claim.reset_pending else {}),
            **({"podClaimName": claim.pod_claim} if claim.pod_claim is not None else {}),
            **(
                {"metadataGenerations": dict(sorted(claim.metadata_generations.items()))}
                if claim.metadata_generations
                else {}
            ),
        }
        for uid, claim in sorted(claims.items())
    }
    document = {"version": CHECKPOINT_VERSION, "driver": DRIVER, "bootID": boot_id, "claims": entries}
    return json.dumps(document, indent=1) + "\n"


def parse_checkpoint(data: bytes | str, origin: str) -> Checkpoint:
    """The checkpoint in data; CheckpointError (CheckpointTooNew for a newer version) naming origin, the field
    and why. Every field is checked for its type: nothing another writer put there raises anything else."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        document = load_json(raw, LIMITS)
    except DocumentError as error:
        raise CheckpointError(f"{origin}: {error}") from None
    if not isinstance(document, dict):
        raise CheckpointError(f"{origin}: not a checkpoint (expected a JSON object, got {kind_of(document)})")
    version = document.get("version")
    if _integer(version) and version > CHECKPOINT_VERSION:
        raise CheckpointTooNew(
            f"{origin}: checkpoint version {version} was written by a newer driver (this one reads up to "
            f"{CHECKPOINT_VERSION}); refusing to start rather than forget its claims: run the newer driver, or "
            "unprepare its claims first"
        )
    if version != CHECKPOINT_VERSION or not _integer(version):
        raise CheckpointError(f"{origin}: unsupported checkpoint version {shown(version)}")
    fields = _Fields(document, origin, "")
    boot_id = fields.text("bootID", default="")
    entries = fields.mapping("claims")
    claims = {uid: _claim_from(uid, entry, _Fields.at(entry, origin, f"claims.{uid[:80]}")) for uid, entry in entries}
    return Checkpoint(boot_id, claims)


def _claim_from(uid: str, entry: Any, fields: _Fields) -> PreparedClaim:
    if not valid_uid(uid):
        raise CheckpointError(f"{fields.where}: not a claim UID (it would name a file outside the CDI directory)")
    complete = fields.boolean("complete", default=True)
    devices = tuple(
        _device_from(_Fields.at(device, fields.origin, f"{fields.path}.devices[{index}]"))
        for index, device in enumerate(fields.sequence("devices"))
    )
    spec = fields.get("spec", dict, "an object")
    ref = ClaimRef(fields.text("namespace"), fields.text("name"), uid)
    if complete and not (ref.namespace and ref.name):
        raise CheckpointError(f"{fields.where}: a complete claim needs its namespace and name")
    pod_claim = fields.get("podClaimName", str, "a string", default=None)
    if pod_claim is not None and not valid_label(pod_claim):
        raise CheckpointError(f"{fields.where}.podClaimName: {shown(pod_claim)} is not a DNS label")
    return PreparedClaim(
        ref,
        devices,
        spec,
        complete=complete,
        reset_pending=fields.boolean("resetPending", False),
        pod_claim=pod_claim,
        metadata_generations=_generations_from(fields),
    )


def _generations_from(fields: _Fields) -> dict[str, int]:
    """The claim's metadata generations by request (absent in a checkpoint of an older driver: none)."""
    generations = fields.get("metadataGenerations", dict, "an object", default={})
    for request, generation in generations.items():
        if not valid_label(request):
            raise CheckpointError(f"{fields.where}.metadataGenerations: {shown(request)} is not a request name")
        if not _integer(generation) or not 1 <= generation <= MAX_GENERATION:
            raise CheckpointError(
                f"{fields.where}.metadataGenerations.{request}: expected a generation (1 to {MAX_GENERATION}), "
                f"got {shown(generation)}"
            )
    return dict(generations)


def _device_from(fields: _Fields) -> PreparedDevice:
    """A device entry: the fields of version 1 required, those added since optional (absent: the default)."""
    shares = fields.integer("shares", default=0)
    kind = fields.text("kind", default=CHIP)
    if kind not in (CHIP, BOARD):
        raise CheckpointError(f"{fields.where}.kind: expected {CHIP} or {BOARD}, got {shown(kind)}")
    if shares < 0:
        raise CheckpointError(f"{fields.where}.shares: expected 0 or more, got {shares}")
    return PreparedDevice(
        fields.texts("requests"),
        fields.text("pool"),
        fields.text("device"),
        fields.text("uuid"),
        fields.texts("cdi_ids"),
        admin=fields.boolean("admin", default=False),
        share_id=fields.text("share_id", default=""),
        shares=shares,
        slots=fields.integers("slots"),
        chips=fields.texts("chips", required=False),
        kind=kind,
        config=lenient(fields.get("config", dict, "an object", default={})),
    )


_MISSING: Any = object()


class _Fields:
    """The fields of one object of the checkpoint, each read with its type or a CheckpointError naming it."""

    def __init__(self, entry: dict[str, Any], origin: str, path: str) -> None:
        self.entry = entry
        self.origin = origin
        self.path = path

    @classmethod
    def at(cls, entry: Any, origin: str, path: str) -> _Fields:
        """The fields of entry, which must be an object."""
        if not isinstance(entry, dict):
            raise CheckpointError(f"{origin}: {path}: expected an object, got {kind_of(entry)}")
        return cls(entry, origin, path)

    @property
    def where(self) -> str:
        """The object, for messages: `<file>: claims.<uid>.devices[0]`."""
        return f"{self.origin}: {self.path}" if self.path else self.origin

    def _name(self, key: str) -> str:
        return f"{self.origin}: {self.path}.{key}" if self.path else f"{self.origin}: {key}"

    def get(self, key: str, kind: type, described: str, default: Any = _MISSING) -> Any:
        value = self.entry.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                raise CheckpointError(f"{self._name(key)}: missing")
            return default
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CheckpointError(f"{self._name(key)}: expected {described}, got {kind_of(value)}")
        return value

    def text(self, key: str, default: Any = _MISSING) -> str:
        return str(self.get(key, str, "a string", default))

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        return bool(self.get(key, bool, "true or false", default))

    def integer(self, key: str, default: Any = _MISSING) -> int:
        return int(self.get(key, int, "an integer", default))

    def sequence(self, key: str, required: bool = True) -> list[Any]:
        return list(self.get(key, list, "a list", _MISSING if required else []))

    def mapping(self, key: str) -> list[tuple[str, Any]]:
        return list(self.get(key, dict, "an object").items())

    def texts(self, key: str, required: bool = True) -> tuple[str, ...]:
        items = self.sequence(key, required)
        if not all(isinstance(item, str) for item in items):
            raise CheckpointError(f"{self._name(key)}: expected a list of strings")
        return tuple(items)

    def integers(self, key: str) -> tuple[int, ...]:
        items = self.sequence(key, required=False)
        if not all(_integer(item) and item >= 0 for item in items):
            raise CheckpointError(f"{self._name(key)}: expected a list of slot numbers")
        return tuple(items)


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
