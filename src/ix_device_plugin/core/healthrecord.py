"""The node-health record, as pure data: what the agent knows of the node's chips that must outlive a process.

XIDs seen, each chip's healing story (its phase, causes, resets tried) and the chips reserved for a reset, as one JSON
document that the pod holding the node's role writes and that every pod of the agent, in either mode, reads: at
start, and (a pod on standby) whenever it changes. Its text and its reading live here; the file is healing/record.py's.

The document is versioned: `version` 1 is this layout. A field this agent does not know, at the top or in a chip's
entry, is kept as it was read and written back, so an older agent running beside a newer one (an upgrade's overlap,
a rollback) loses nothing. A newer version, or anything malformed, is a RecordError naming the file and what is
wrong: the caller keeps that file aside and starts from the hardware, never trusting a part of it silently.

What a reboot clears (the record names the boot it was written in), by the XID's policy: a reboot resets every
chip, so an XID whose action is `reset` is forgotten, and so is one whose remedy the table says is a reboot (XID 79,
fallen off the bus) unless ix-config's `health.operator` names it; with them goes the healing story of a chip that
had nothing else. Any other XID whose action is `operator` (XID 64: the memory needs service) stays until an
operator returns the chip (`iluvatar.com/gpu.return`), and so does that chip's story. Reservations end with the
process that held them, or with the boot.

A chip's reset history (`resets`: the Unix times of the resets started for its faults, one per fault, oldest first,
at most MAX_RESETS; core/healing.py's reset limit counts them) is kept across restarts and reboots alike (a chip that
faults again after a reboot is the same chip), also while the chip is healthy; only an operator's return clears it.
It is written pruned to the limit's window. `resetLimitReached: true` says the chip needs an operator because of the
limit. Both fields are optional (absent: no history, false), written only when they say something: an older agent
keeps them as fields it does not know.

`returnsSeen` (optional, at the top): the chips the operator's annotation `iluvatar.com/gpu.return` named when the
pod acting for the node last read it, each one asked for already. The next agent counts only a chip named beyond
them as a new request, so a return made while no agent watched (restarting, the API server away) is not lost, and
one handled before is not made again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ix_device_plugin.core.healing import HEALTHY, MAX_RESETS, NEEDS_OPERATOR, PHASES, RESETTING, WAITING, Care
from ix_device_plugin.settings.documents import DocumentError, Limits, load_json_text
from ix_device_plugin.settings.health import HealthPolicy, xid_name

VERSION = 1
KIND = "ix-device-plugin/node-health"
MAX_CHIPS = 1024  # more chip entries than any node has: the rest is not read
MAX_XIDS = 16  # per chip, as the monitor keeps them
MAX_TEXT = 1024  # a note, a cause or a reservation's reason
# The bounds of every document another process writes (a nest of `[` 100 KB deep is refused, not a RecursionError).
LIMITS = Limits(max_bytes=1024 * 1024, max_depth=32, max_values=100_000)
CUT_SHORT = "its reset was cut short when the agent stopped; it is reset again once free"


class RecordError(Exception):
    """The record cannot be used; the message names what is wrong (the caller adds the file)."""


@dataclass(frozen=True)
class ChipRecord:
    """One chip as the record keeps it. Times are Unix times; reserved is why the chip is held out ("" if not)."""

    minor: int | None = None
    xids: frozenset[int] = frozenset()
    phase: str = HEALTHY
    causes: tuple[str, ...] = ()
    attempts: int = 0
    note: str = ""
    out_since: float | None = None
    operator_return: bool = False
    returned_for: tuple[str, ...] | None = None  # the chip's causes when the operator asked (None: not known)
    reserved: str = ""
    reserved_since: float | None = None
    resets: tuple[float, ...] = ()  # Unix times of the resets started for its faults, oldest first
    reset_limited: bool = False  # it needs an operator because of the reset limit
    extra: Mapping[str, Any] = field(default_factory=dict)  # fields of a newer agent, kept as read

    @property
    def worth_keeping(self) -> bool:
        """True when the entry says something a healthy chip without a history would not."""
        return bool(self.xids or self.phase != HEALTHY or self.reserved or self.resets or self.extra)


@dataclass(frozen=True)
class HealthRecord:
    """The whole record: the boot it was written in, by whom, and each chip worth remembering (by UUID)."""

    boot_id: str = ""
    writer: str = ""
    written: float = 0.0
    chips: Mapping[str, ChipRecord] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    returns_seen: frozenset[str] | None = None  # None: not said (an older agent's record)

    def reserved(self) -> dict[str, str]:
        """Chip UUID -> why it is reserved, for the chips held out of service for a reset."""
        return {uuid: chip.reserved for uuid, chip in self.chips.items() if chip.reserved}

    def xids(self) -> dict[str, frozenset[int]]:
        """Chip UUID -> the XIDs seen on it."""
        return {uuid: chip.xids for uuid, chip in self.chips.items() if chip.xids}


@dataclass(frozen=True)
class Restored:
    """What a start takes from the record: the XIDs to keep, the healing stories, and the chips still reserved."""

    xids: Mapping[str, frozenset[int]] = field(default_factory=dict)
    cares: Mapping[str, Care] = field(default_factory=dict)
    reserved: Mapping[str, str] = field(default_factory=dict)
    forgotten: tuple[str, ...] = ()  # what the reboot cleared, for the log


# ---- writing ------------------------------------------------------------------------------------


def record_text(record: HealthRecord) -> str:
    """The record as the file holds it (chips sorted, so that equal records are equal files)."""
    document: dict[str, Any] = {
        **record.extra,
        "kind": KIND,
        "version": VERSION,
        "bootID": record.boot_id,
        "writer": record.writer,
        "written": round(record.written, 3),
        "chips": {uuid: _chip_document(chip) for uuid, chip in sorted(record.chips.items())},
    }
    if record.returns_seen is not None:
        document["returnsSeen"] = sorted(record.returns_seen)
    return json.dumps(document, indent=1, sort_keys=False) + "\n"


def _chip_document(chip: ChipRecord) -> dict[str, Any]:
    document: dict[str, Any] = {
        **chip.extra,
        "minor": chip.minor,
        "xids": sorted(chip.xids),
        "phase": chip.phase,
        "causes": list(chip.causes),
        "attempts": chip.attempts,
        "note": chip.note,
        "outSince": None if chip.out_since is None else round(chip.out_since, 3),
        "operatorReturn": chip.operator_return,
    }
    if chip.operator_return and chip.returned_for is not None:
        document["returnedFor"] = list(chip.returned_for)
    if chip.reserved:
        document["reserved"] = {"reason": chip.reserved, "since": round(chip.reserved_since or 0.0, 3)}
    if chip.resets:
        document["resets"] = [round(when, 3) for when in chip.resets]
    if chip.reset_limited:
        document["resetLimitReached"] = True
    return document


def chip_record(care: Care, xids: frozenset[int], reserved: str, *, wall_now: float, mono_now: float,
                reserved_since: float | None = None, extra: Mapping[str, Any] | None = None,
                window: float | None = None) -> ChipRecord:  # fmt: skip
    """A chip's entry from its healing story (monotonic times turned into Unix times), its XIDs and reservation;
    window: the reset limit's, the reset times older than it left out (None: all kept)."""
    out_since = None if care.out_since is None else wall_now - (mono_now - care.out_since)
    resets = care.resets if window is None else tuple(when for when in care.resets if when > wall_now - window)
    return ChipRecord(
        minor=care.minor,
        xids=xids,
        phase=care.phase,
        causes=care.causes,
        attempts=care.attempts,
        note=care.note,
        out_since=out_since,
        operator_return=care.operator_return,
        returned_for=care.returned_for if care.operator_return else None,
        reserved=reserved,
        reserved_since=(reserved_since or wall_now) if reserved else None,
        resets=resets[-MAX_RESETS:],
        reset_limited=care.limited,
        extra=dict(extra or {}),
    )


# ---- reading ------------------------------------------------------------------------------------


def parse_record(text: str) -> HealthRecord:
    """The record in text; RecordError naming what is wrong (a newer version, malformed JSON, a bad field)."""
    try:
        document = load_json_text(text, LIMITS)
    except DocumentError as error:
        raise RecordError(f"the document {error}") from None
    if not isinstance(document, dict):
        raise RecordError("not a JSON object")
    if document.get("kind") != KIND:
        raise RecordError(f"kind is {document.get('kind')!r}, not {KIND!r}")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordError(f"version is {version!r}, not a positive integer")
    if version > VERSION:
        raise RecordError(f"version {version} was written by a newer agent (this one reads version {VERSION})")
    chips = document.get("chips")
    if not isinstance(chips, dict):
        raise RecordError("chips is not an object")
    if len(chips) > MAX_CHIPS:
        raise RecordError(f"{len(chips)} chips, more than the {MAX_CHIPS} any node has")
    known = {"kind", "version", "bootID", "writer", "written", "chips", "returnsSeen"}
    return HealthRecord(
        boot_id=_text(document.get("bootID", ""), "bootID"),
        writer=_text(document.get("writer", ""), "writer"),
        written=_number(document.get("written", 0.0), "written") or 0.0,
        chips={_text(uuid, "a chip's UUID"): _parse_chip(entry, uuid) for uuid, entry in chips.items()},
        extra={key: value for key, value in document.items() if key not in known},
        returns_seen=_returns_seen(document.get("returnsSeen")),
    )


def _returns_seen(value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_CHIPS:
        raise RecordError(f"returnsSeen is not a list of at most {MAX_CHIPS} chips")
    return frozenset(_text(chip, "returnsSeen") for chip in value)


_CHIP_FIELDS = {"minor", "xids", "phase", "causes", "attempts", "note", "outSince", "operatorReturn", "returnedFor",
                "reserved", "resets", "resetLimitReached"}  # fmt: skip


def _parse_chip(entry: Any, uuid: str) -> ChipRecord:
    where = f"chips.{uuid[:80]}"
    if not isinstance(entry, dict):
        raise RecordError(f"{where} is not an object")
    minor = entry.get("minor")
    if minor is not None and (not isinstance(minor, int) or isinstance(minor, bool) or minor < 0):
        raise RecordError(f"{where}.minor is {minor!r}, not a chip index")
    xids = entry.get("xids", [])
    if not isinstance(xids, list) or len(xids) > MAX_XIDS or not all(_is_count(x) for x in xids):
        raise RecordError(f"{where}.xids is not a list of at most {MAX_XIDS} XID numbers")
    phase = entry.get("phase", HEALTHY)
    if phase not in PHASES:
        raise RecordError(f"{where}.phase is {phase!r}, not one of {', '.join(PHASES)}")
    causes = entry.get("causes", [])
    if not isinstance(causes, list) or len(causes) > MAX_XIDS * 4:
        raise RecordError(f"{where}.causes is not a list")
    attempts = entry.get("attempts", 0)
    if _is_count(-attempts if isinstance(attempts, int) else attempts):
        attempts = 0  # the release before wrote -1 after a reset refused before it started: no attempt made
    if not _is_count(attempts):
        raise RecordError(f"{where}.attempts is {attempts!r}, not a count")
    operator_return = entry.get("operatorReturn", False)
    if not isinstance(operator_return, bool):
        raise RecordError(f"{where}.operatorReturn is {operator_return!r}, not true or false")
    returned_for = entry.get("returnedFor")
    if returned_for is not None and (not isinstance(returned_for, list) or len(returned_for) > MAX_XIDS * 4):
        raise RecordError(f"{where}.returnedFor is not a list")
    reserved, since = _reservation(entry.get("reserved"), where)
    reset_limited = entry.get("resetLimitReached", False)
    if not isinstance(reset_limited, bool):
        raise RecordError(f"{where}.resetLimitReached is {reset_limited!r}, not true or false")
    return ChipRecord(
        minor=minor,
        xids=frozenset(xids),
        phase=phase,
        causes=tuple(_text(cause, f"{where}.causes") for cause in causes),
        attempts=attempts,
        note=_text(entry.get("note", ""), f"{where}.note"),
        out_since=_number(entry.get("outSince"), f"{where}.outSince"),
        operator_return=operator_return,
        returned_for=None if returned_for is None else tuple(_text(r, f"{where}.returnedFor") for r in returned_for),
        reserved=reserved,
        reserved_since=since,
        resets=_resets(entry.get("resets", []), f"{where}.resets"),
        reset_limited=reset_limited,
        extra={key: value for key, value in entry.items() if key not in _CHIP_FIELDS},
    )


def _resets(value: Any, where: str) -> tuple[float, ...]:
    """A chip's reset times, oldest first: a list of at most MAX_RESETS Unix times."""
    if not isinstance(value, list) or len(value) > MAX_RESETS:
        raise RecordError(f"{where} is not a list of at most {MAX_RESETS} times")
    return tuple(sorted(_time(when, where) for when in value))


def _time(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise RecordError(f"{where} holds {value!r}, not a time")
    return float(value)


def _reservation(value: Any, where: str) -> tuple[str, float | None]:
    if value is None:
        return "", None
    if not isinstance(value, dict):
        raise RecordError(f"{where}.reserved is not an object")
    reason = _text(value.get("reason", ""), f"{where}.reserved.reason")
    if not reason:
        raise RecordError(f"{where}.reserved.reason is empty")
    return reason, _number(value.get("since"), f"{where}.reserved.since")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise RecordError(f"{where} is not a text of at most {MAX_TEXT} characters")
    return value


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RecordError(f"{where} is {value!r}, not a time")
    return float(value)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31


# ---- what a start takes from it -------------------------------------------------------------------


def restore(record: HealthRecord, boot_id: str, policy: HealthPolicy, *, wall_now: float, mono_now: float) -> Restored:
    """What a process starting now keeps of record (boot_id: this boot; policy: the health policy in force)."""
    rebooted = bool(record.boot_id and boot_id and record.boot_id != boot_id)
    xids: dict[str, frozenset[int]] = {}
    cares: dict[str, Care] = {}
    reserved: dict[str, str] = {}
    forgotten: list[str] = []
    for uuid, chip in record.chips.items():
        kept = chip.xids
        if rebooted:
            kept = frozenset(x for x in chip.xids if not policy.cleared_by_reboot(xid_name(x)))
            if kept != chip.xids:
                forgotten.append(f"{uuid}: {', '.join(map(xid_name, sorted(chip.xids - kept)))}")
        if kept:
            xids[uuid] = kept
        if rebooted and not kept:  # the reboot reset the chip: its story starts again from its health, its history kept
            if chip.resets:
                cares[uuid] = Care(uuid, chip.minor, resets=chip.resets)
            continue
        care = _care(uuid, chip, wall_now=wall_now, mono_now=mono_now)
        if chip.reserved and not rebooted:
            reserved[uuid] = chip.reserved
            if care.phase == RESETTING:
                care = replace(care, phase=WAITING, retry_at=0.0, note=CUT_SHORT)
        elif care.phase == RESETTING:  # a reboot ended it
            care = replace(care, phase=WAITING, retry_at=0.0, note=CUT_SHORT)
        if care.phase != HEALTHY or care.resets:
            cares[uuid] = care
    return Restored(xids, cares, reserved, tuple(forgotten))


def _care(uuid: str, chip: ChipRecord, *, wall_now: float, mono_now: float) -> Care:
    out_since = None if chip.out_since is None else mono_now - max(0.0, wall_now - chip.out_since)
    return Care(
        uuid,
        chip.minor,
        phase=chip.phase,
        causes=chip.causes,
        attempts=chip.attempts,
        retry_at=0.0,
        out_since=out_since,
        note=chip.note,
        operator_return=chip.operator_return,
        returned_for=chip.returned_for,
        resets=chip.resets,
        limited=chip.reset_limited,
    )


def needs_operator(record: HealthRecord) -> list[str]:
    """The chips the record says need an operator."""
    return sorted(uuid for uuid, chip in record.chips.items() if chip.phase == NEEDS_OPERATOR)
