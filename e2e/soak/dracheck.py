"""The soak's judgement of DRA prepares: a pod whose claim the driver refuses is not failed, the kubelet retries
NodePrepareResources while the pod waits, and records an Event on the pod each time (reason
FailedPrepareDynamicResources, `pkg/kubelet/kuberuntime/kuberuntime_manager.go`). Pure, as checker.py: the Events
as the API server lists them in, failures out, judged like the device plugin's admissions.

Imports nothing of the agent (tests/unit/test_soak_schedule.py parses the imports).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .checker import GRACE_S, RESTART_NEAR_S, RESTARTING, Broken, Given, Invariant

REASON = "FailedPrepareDynamicResources"
UUID = re.compile(r"GPU-[0-9a-f-]+")
HOLDER = re.compile(r"is prepared for claim [^/\s]+/([^\s)]+)")  # the claim that holds the chip; the soak names a
# pod's claims `<pod>-c<n>`
# The same where the driver rebuilt the holder from its CDI spec (a lost checkpoint), which keeps no name: its UID.
HOLDER_UID = re.compile(r"is prepared for claim unnamed \(uid ([0-9a-f-]+)\)")
# A board out of service names the chip each of its reasons is of ("gpu-1: XID 61"): those broke it, not its others.
CHIP_REASON = re.compile(r"\bgpu-(\d+): ")
# What the kubelet or the driver says while what the agent stands on is away for a while (a quiet window: the agent
# or the kubelet restarting, the API server restarted or stopped, the disk full, a config change restarting the
# driver): the driver not registered or its socket gone, the claim not readable, the checkpoint not writable.
QUIET_WORDS = (
    *RESTARTING,
    "is not registered",
    "connection refused",
    "code = Canceled",
    "code = DeadlineExceeded",
    "context deadline exceeded",
    "error reading from server",
    "transport is closing",
    "is being unprepared",
    "fetch ResourceClaim",
    "from the API server",
    "No space left on device",
)
# What the driver rightly says of a claim allocated under the config before (docs/dra.md, "What survives what"): a
# share of a device no longer shared, a device no longer published, a chip now held by a claim of the other shape.
CONFIG_WORDS = ("not shared on this node now", "is not on this node", "is prepared for claim")
# What the driver rightly says of a chip the soak broke: reserved for the reset that heals it, gone from the bus, or
# out of service for a claim that does not tolerate its taints (allocated before it broke, or from stale slices).
BROKEN_WORDS = ("is reserved for a GPU reset", "cannot be given to a container now", "is out of service")
AFTER_HEALED_S = GRACE_S + 2.0  # the agent may hold a chip out this long after its reset ended (the record written)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 6


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def given(
    claims: Iterable[Any], driver: str, chips_of: Callable[[str], set[int]], uuids: Sequence[str]
) -> tuple[Given, ...]:
    """The devices these claims' allocations give (the driver's results): each with its chips (chips_of its device
    name), the UUID the driver names it by (a board's: its first chip's), and for a share (a `shareID`) the slots
    its shares take (the `consumedCapacity` shares, 1 when not said; none when given with admin access)."""
    found = []
    for made in claims:
        devices = _dict(_dict(_dict(made).get("status")).get("allocation")).get("devices")
        results = _dict(devices).get("results")
        for result in results if isinstance(results, list) else []:
            result = _dict(result)
            chips = chips_of(_text(result.get("device"))) if result.get("driver") == driver else set()
            if not chips or max(chips) >= len(uuids):
                continue
            share = _text(result.get("shareID"))
            slots = None
            if share:
                taken = str(_dict(result.get("consumedCapacity")).get("shares", "1"))
                slots = 0 if result.get("adminAccess") is True else int(taken) if _count(taken) else 1
            found.append(Given(frozenset(chips), uuids[min(chips)], slots, share))
    return tuple(found)


def claim_uids(claims: dict[str, list[Any]]) -> dict[str, str]:
    """Claim UID -> its pod, of these pods' claims (pod -> its claims); anything without a UID is skipped."""
    return {
        uid: pod
        for pod, made in claims.items()
        for claim in made
        if (uid := _text(_dict(_dict(claim).get("metadata")).get("uid")))
    }


@dataclass(frozen=True)
class PrepareFailure:
    """One NodePrepareResources the kubelet reported failed for a pod: when (soak time) and what it said."""

    at: float
    pod: str
    message: str


def _seconds(stamp: str) -> float | None:
    """An RFC 3339 time (`2026-12-05T10:00:00Z`, with or without fractions) as a Unix time; None when not one."""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def new_failures(events: Iterable[Any], start: float, now: float, counted: dict[str, int]) -> list[PrepareFailure]:
    """The prepare failures these Events add to what `counted` (event name -> its count, updated here) has seen:
    an Event the kubelet repeats is the same object with its count raised, each raise one failure more, at its
    lastTimestamp (soak time; `now` when it has none). Anything else in the list is skipped."""
    found = []
    for event in events:
        if not isinstance(event, dict) or event.get("reason") != REASON:
            continue
        involved = event.get("involvedObject")
        metadata = event.get("metadata")
        if not isinstance(involved, dict) or involved.get("kind") != "Pod" or not isinstance(metadata, dict):
            continue
        name = _text(metadata.get("name"))
        count = event.get("count")
        count = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
        if not name or count <= counted.get(name, 0):
            continue
        stamp = _seconds(_text(event.get("lastTimestamp")) or _text(event.get("eventTime")))
        at = now if stamp is None else stamp - start
        found += [PrepareFailure(at, _text(involved.get("name")), _text(event.get("message"))[:400])]
        counted[name] = count
    return found


def broken_then(chip: int, at: float, broken: Sequence[Broken], since: float | None = None) -> bool:
    """The soak had the chip broken at `at` (from a moment before to a while after it was healed), or at any time
    from `since` on (the start of a quiet window `at` falls in: the agent holds a healed chip out until its record
    is written, which a full disk puts off)."""
    start = at if since is None else min(since, at)
    return any(
        w.chip == chip and w.since - 1.0 <= at and (w.until is None or start <= w.until + AFTER_HEALED_S)
        for w in broken
    )


def prepare_failures(
    invariant: Invariant,
    failures: Iterable[PrepareFailure],
    quiet: Sequence[tuple[float, float]],
    broken: Sequence[Broken],
    chip_of: dict[str, int],
    changes: Sequence[tuple[float, float]] = (),
    allocated_at: dict[str, float] | None = None,
    claim_pods: dict[str, str] | None = None,
) -> None:
    """No claim's prepare fails for a reason the agent caused: rightly only while what the agent stands on is away
    (within RESTART_NEAR_S of a quiet window, saying so: QUIET_WORDS), for a chip the soak had broken then, which
    the driver holds out until it is healed (BROKEN_WORDS, naming only chips broken then), or for a claim allocated
    before a config change that the config in force cannot serve (CONFIG_WORDS), or whose chip such a claim holds
    (the scheduler counts a share allocated before the change as no hold on a device the change made whole).

    `changes`: each config change as (began, in force): the driver restarted with the new config somewhere between,
    so a claim allocated before it was in force may meet the new driver from its beginning on. `allocated_at`: pod
    -> the earliest its claims may have been allocated (the soak's last look before it saw them allocated, or the
    pod's creation when it never saw them: it does not look while it changes the config). `claim_pods`: claim UID
    -> its pod, for a holder the driver names by its UID alone (rebuilt from its CDI spec)."""
    allocated_at, claim_pods = allocated_at or {}, claim_pods or {}
    for failure in failures:
        text = failure.message
        near = any(begin - RESTART_NEAR_S <= failure.at <= end + RESTART_NEAR_S for begin, end in quiet)
        away = near and any(words in text for words in QUIET_WORDS)
        chips = {int(chip) for chip in CHIP_REASON.findall(text)} or {
            chip_of[uuid] for uuid in UUID.findall(text) if uuid in chip_of
        }
        held_out = any(words in text for words in BROKEN_WORDS) and bool(chips)
        quiet_since = min((begin for begin, end in quiet if begin <= failure.at <= end + RESTART_NEAR_S), default=None)
        held_out = held_out and all(broken_then(chip, failure.at, broken, quiet_since) for chip in chips)
        pods = [failure.pod] + [re.sub(r"-c\d+$", "", claim) for claim in HOLDER.findall(text)]
        pods += [claim_pods[uid] for uid in HOLDER_UID.findall(text) if uid in claim_pods]
        allocated = min(allocated_at.get(pod, failure.at) for pod in pods)
        stale = any(allocated <= in_force and began <= failure.at for began, in_force in changes)
        stale = stale and any(words in text for words in CONFIG_WORDS)
        invariant.check(away or held_out or stale, failure.at, f"{failure.pod}: prepare failed: {text}")
