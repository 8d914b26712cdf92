"""The soak's invariants, judged from outside the agent: from what the kubelet, the API server, the containers and
the simulated hardware said, as the observer (observe.py) recorded it. Pure functions over that record.

This module imports nothing of the agent (tests/unit/test_soak_schedule.py parses its imports), so a defect in the
agent's own model of the node cannot hide one here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

BOUND_S = 30.0  # a chip healthy (healed, returned or never broken) is back in service within this
GRACE_S = 3.0  # after a fault, the agent's health poll (0.5 s) and the kubelet's update may still hand the chip out
MAX_RSS_KIB = 300 * 1024
MAX_OPEN_FILES = 200
ROLLOUT_BOUND_S = 10.0  # after a rollout is done, what it may still take out comes back within this
ROLLOUT_SETTLED_S = 5.0  # a rollout is done when the DaemonSet has been settled this long


@dataclass(frozen=True)
class Holding:
    """A container that certainly holds chips at `at`: its pod is Running, not being deleted, and its allocation
    (the kubelet's device checkpoint or the pod's claims) names them."""

    pod: str
    chips: frozenset[int]


@dataclass(frozen=True)
class HoldSample:
    at: float
    holdings: tuple[Holding, ...]

    def holders(self, chip: int) -> set[str]:
        return {holding.pod for holding in self.holdings if chip in holding.chips}


@dataclass(frozen=True)
class Reset:
    """One run of the ixsmi stand-in: the chips it reset, when it started and (None while running) ended."""

    started: float
    ended: float | None
    chips: frozenset[int]
    ok: bool = False


@dataclass(frozen=True)
class Broken:
    """A chip the simulated hardware reported broken from `since` until `until` (None: not healed yet); `maybe`: an
    XID the agent may rightly have forgotten (windows.py), not judged by "broken not given"."""

    chip: int
    since: float
    until: float | None
    why: str
    maybe: bool = False


@dataclass(frozen=True)
class NewAllocation:
    """A pod first seen holding chips at `seen`, not seen holding them at the sample before, `after`."""

    pod: str
    chips: frozenset[int]
    after: float
    seen: float


@dataclass(frozen=True)
class ServiceSample:
    """At `at`: for DRA, the chips the node's ResourceSlice offers untainted (in_service); for the device plugin, the
    allocatable count and the count the healthy units would give (the runner computes it from the config)."""

    at: float
    in_service: frozenset[int] | None = None
    allocatable: int | None = None


@dataclass
class Rollout:
    """A `helm upgrade` or `helm rollback` that rolls the agent's pods, from `began` until the DaemonSet's rollout
    was `done` (None: not yet), with what was in service just before it (DRA: the chips; device plugin:
    allocatable)."""

    began: float
    before: frozenset[int] | int
    what: str
    done: float | None = None


@dataclass(frozen=True)
class Given:
    """One device a DRA allocation gives: its chips, the UUID IX_REPLICA_DEVICES names it by (a chip's; a board's is
    its first chip's), and for a share the slots it takes (None: held whole; 0: a share given with admin access,
    which takes none)."""

    chips: frozenset[int]
    uuid: str
    slots: int | None = None
    share: str = ""  # the allocation's shareID


@dataclass(frozen=True)
class Seen:
    """What a container showed from the inside (device nodes, CoreX variables) against what its allocation names."""

    at: float
    pod: str
    nodes: dict[str, str]
    env: dict[str, str]
    expected: tuple[frozenset[int], ...]  # the chip sets its allocation may mean (one unless the config changed)
    given: tuple[Given, ...] | None = None  # DRA: the devices and shares, so IX_REPLICA_DEVICES is checked too


@dataclass
class Invariant:
    name: str
    checks: int = 0
    violations: list[tuple[float, str]] = field(default_factory=list)

    def check(self, ok: bool, at: float, what: str) -> None:
        self.checks += 1
        if not ok:
            self.violations.append((at, what))


def devices_match(invariant: Invariant, seen: Seen, uuids: Sequence[str], device_major: int, control: int) -> None:
    """Every running container sees exactly the devices its allocation names: /dev/iluvatar<minor> of each chip and
    /dev/itrctl, and IX_VISIBLE_DEVICES (and ILUVATAR_COREX_VISIBLE_DEVICES) naming exactly those chips."""
    visible = seen.env.get("IX_VISIBLE_DEVICES", "")
    corex = seen.env.get("ILUVATAR_COREX_VISIBLE_DEVICES", "")
    for chips in seen.expected:
        nodes = {f"/dev/iluvatar{chip}": f"{device_major:x}:{chip:x}" for chip in chips}
        nodes["/dev/itrctl"] = f"{device_major:x}:{control:x}"
        want = {uuids[chip] for chip in chips}
        replicas = seen.given is None or replicas_match(seen.env, seen.given)
        if seen.nodes == nodes and set(visible.split(",")) == want and corex == visible and replicas:
            invariant.check(True, seen.at, seen.pod)
            return
    shown = f"nodes {sorted(seen.nodes)} IX_VISIBLE_DEVICES={visible} ILUVATAR_COREX_VISIBLE_DEVICES={corex}"
    if seen.given is not None:
        wanted = ",".join(g.uuid if g.slots is None else f"{g.uuid}::<{g.slots} slots>" for g in seen.given)
        shown += f" IX_REPLICA_DEVICES={seen.env.get(REPLICAS, '')} (wanted {wanted})"
        shown += f" ILUVATAR_COREX_REPLICA_DEVICES={seen.env.get(COREX_REPLICAS, '')}"
    options = " or ".join(str(sorted(chips)) for chips in seen.expected)
    invariant.check(False, seen.at, f"{seen.pod}: allocation names chips {options}, the container shows {shown}")


REPLICAS, COREX_REPLICAS = "IX_REPLICA_DEVICES", "ILUVATAR_COREX_REPLICA_DEVICES"


def replica_slots(env: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
    """IX_REPLICA_DEVICES read: the devices named whole (`<uuid>`), and each shared device's slots (`<uuid>::<n>`)."""
    whole: list[str] = []
    slots: dict[str, list[str]] = {}
    for item in (i for i in env.get(REPLICAS, "").split(",") if i):
        uuid, shared, slot = item.partition("::")
        if shared:
            slots.setdefault(uuid, []).append(slot)
        else:
            whole.append(item)
    return whole, slots


def replicas_match(env: dict[str, str], given: Sequence[Given]) -> bool:
    """IX_REPLICA_DEVICES (and its CoreX twin, the same) names each device held whole once, by its UUID, and each
    shared device by as many distinct numbered slots (`<uuid>::<n>`) as its shares take, nothing else."""
    whole, slots = replica_slots(env)
    wanted: dict[str, int] = {}
    for device in given:
        if device.slots:
            wanted[device.uuid] = wanted.get(device.uuid, 0) + device.slots
    numbered = all(len(set(s)) == len(s) and all(n.isdigit() for n in s) for s in slots.values())
    return (
        env.get(COREX_REPLICAS, "") == env.get(REPLICAS, "")
        and len(set(whole)) == len(whole)
        and set(whole) == {device.uuid for device in given if device.slots is None}
        and {uuid: len(s) for uuid, s in slots.items()} == wanted
        and numbered
    )


def slots_apart(
    invariant: Invariant,
    at: float,
    pod: str,
    mine: Sequence[Given],
    env: dict[str, str],
    others: dict[str, tuple[tuple[Given, ...], dict[str, str]]],
) -> None:
    """Shares of one device that different claims hold are numbered apart: a container's slots on a device are none
    of another running container's there, unless the two hold a share in common (one claim named by both pods)."""
    _, own = replica_slots(env)
    shares = {device.share for device in mine if device.share}
    for other, (given, shown) in sorted(others.items()):
        if other == pod or shares & {device.share for device in given if device.share}:
            continue
        _, theirs = replica_slots(shown)
        common = {f"{uuid}::{n}" for uuid, s in own.items() for n in s if n in theirs.get(uuid, [])}
        if own.keys() & theirs.keys():
            invariant.check(not common, at, f"{pod} and {other} both hold the share slots {sorted(common)}")


def no_reset_under_holder(invariant: Invariant, resets: Iterable[Reset], samples: Sequence[HoldSample]) -> None:
    """No chip is reset while a container holds it: a container that held a chip before the reset started and still
    holds it after the reset ended held it throughout."""
    for reset in resets:
        if reset.ended is None:
            continue
        before = [s for s in samples if s.at <= reset.started]
        after = [s for s in samples if s.at >= reset.ended]
        if not before or not after:
            continue
        for chip in sorted(reset.chips):
            held = before[-1].holders(chip) & after[0].holders(chip)
            invariant.check(
                not held, reset.started, f"chip {chip} reset at {reset.started:.1f}-{reset.ended:.1f} held by {held}"
            )


def broken_not_given(
    invariant: Invariant,
    allocations: Iterable[NewAllocation],
    broken: Sequence[Broken],
    outages: Sequence[tuple[float, float]] = (),
) -> None:
    """A chip reported broken is not given to a new container until it is healed or returned: a new allocation
    made wholly inside a broken window (after the grace) is a violation. `outages`: (DRA) the API server not
    answering, (began, back): a chip that broke in one, or just before, is tainted in its slice only once the
    server is back, so its grace runs from then."""
    for allocation in allocations:
        for chip in sorted(allocation.chips):
            bad = [
                window
                for window in broken
                if window.chip == chip
                and not window.maybe
                and allocation.after >= _sayable_from(window.since, outages) + GRACE_S
                and (window.until is None or allocation.seen <= window.until)
            ]
            what = f"{allocation.pod} got chip {chip} between {allocation.after:.1f} and {allocation.seen:.1f}"
            invariant.check(not bad, allocation.seen, what + "".join(f"; broken: {w.why}" for w in bad))


def _sayable_from(since: float, outages: Sequence[tuple[float, float]]) -> float:
    """When the agent can first tell the API server of a fault that began at since."""
    return max([since] + [back for began, back in outages if began - GRACE_S <= since <= back])


def given_by_prepare(
    allocations: Iterable[NewAllocation], away: Sequence[tuple[float, float]], running: Mapping[str, float]
) -> list[NewAllocation]:
    """DRA: the allocations as "broken not given" judges them. One the scheduler made while no driver served the
    node (switched to the device plugin: the kubelet keeps the slices for a while after the driver unregisters,
    and no agent writes them) gives its chips only when the driver, back, prepares the claim: judged from the
    driver's return until the pod was seen running, and not at all when it never ran. `away`: (since, back)."""
    judged = []
    for allocation in allocations:
        made_away = [back for since, back in away if since <= allocation.after and allocation.seen <= back]
        if not made_away:
            judged.append(allocation)
        elif allocation.pod in running and running[allocation.pod] >= made_away[0]:
            judged.append(NewAllocation(allocation.pod, allocation.chips, made_away[0], running[allocation.pod]))
    return judged


def healthy_since(chip: int, at: float, broken: Sequence[Broken], quiet: Sequence[tuple[float, float]]) -> bool:
    """The chip has been healthy for BOUND_S at `at`, and nothing that may take everything out a while (an agent or
    kubelet restart, a config change) happened in that time."""
    start = at - BOUND_S
    for window in broken:
        if window.chip == chip and window.since <= at and (window.until is None or window.until > start):
            return False
    return not any(begin <= at and end > start for begin, end in quiet)


def back_in_service(
    invariant: Invariant,
    sample: ServiceSample,
    chips: int,
    broken: Sequence[Broken],
    quiet: Sequence[tuple[float, float]],
    expected_allocatable: int | None = None,
    together: Sequence[frozenset[int]] = (),
) -> None:
    """Every chip healthy for BOUND_S is in service (DRA: untainted in the slice; device plugin: allocatable at
    least what the long-healthy units give). `together`: chips the slice offers only as one device (DRA, whole
    boards shared): one is in service only when all of them have been healthy that long."""
    settled = [chip for chip in range(chips) if healthy_since(chip, sample.at, broken, quiet)]
    settled = [chip for chip in settled if all(other in settled for unit in together if chip in unit for other in unit)]
    if sample.in_service is not None:
        for chip in settled:
            invariant.check(
                chip in sample.in_service,
                sample.at,
                f"chip {chip} healthy since {BOUND_S:.0f} s+ and "
                f"not in service (in service: {sorted(sample.in_service)})",
            )
    elif sample.allocatable is not None and expected_allocatable is not None:
        invariant.check(
            sample.allocatable >= expected_allocatable,
            sample.at,
            f"allocatable {sample.allocatable} < {expected_allocatable} for the chips healthy since {BOUND_S:.0f} s+",
        )


def bounded(invariant: Invariant, at: float, rss_kib: int, open_files: int) -> None:
    """The agent's resident memory and open files stay under their bounds."""
    invariant.check(
        rss_kib <= MAX_RSS_KIB and open_files <= MAX_OPEN_FILES,
        at,
        f"agent RSS {rss_kib} KiB (max {MAX_RSS_KIB}), open files {open_files} (max {MAX_OPEN_FILES})",
    )


def nothing_left(invariant: Invariant, at: float, leftovers: Iterable[str]) -> None:
    """After the soak: nothing of the workload or the agent is left (each leftover is one violation)."""
    found = list(leftovers)
    invariant.check(not found, at, "left behind: " + ", ".join(found))


def kept_in_rollout(
    invariant: Invariant,
    rollout: Rollout,
    sample: ServiceSample,
    broken: Sequence[Broken],
    quiet: Sequence[tuple[float, float]],
    allocatable_without: Callable[[frozenset[int]], int] | None = None,
    together: Sequence[frozenset[int]] = (),
) -> None:
    """`together`: chips the slice offers only as one device (DRA, whole boards shared), all out with any one.
    From a rollout's start until ROLLOUT_BOUND_S after it is done, nothing in service just before it goes out of
    service, but what a fault took out since: DRA, every chip it offered untainted; device plugin, allocatable at
    least what it was, or what the chips no fault took out give (allocatable_without(those taken out)). Not judged
    while a fault that takes everything out a while (an agent or kubelet restart, a config change) overlaps it."""
    at = sample.at
    if at < rollout.began or (rollout.done is not None and at > rollout.done + ROLLOUT_BOUND_S):
        return
    if any(begin <= at and end >= rollout.began for begin, end in quiet):
        return
    out = frozenset(w.chip for w in broken if w.since <= at and (w.until is None or w.until >= rollout.began))
    out = out.union(*(unit for unit in together if unit & out))
    began = f"{rollout.what} (from t+{rollout.began:.1f})"
    if sample.in_service is not None and isinstance(rollout.before, frozenset):
        missing = sorted(rollout.before - out - sample.in_service)
        invariant.check(not missing, at, f"{began}: chips {missing} out of service, in service before, no fault since")
    elif sample.allocatable is not None and isinstance(rollout.before, int):
        floor = rollout.before if allocatable_without is None else min(rollout.before, allocatable_without(out))
        invariant.check(
            sample.allocatable >= floor,
            at,
            f"{began}: allocatable {sample.allocatable} < {floor} ({rollout.before} before it, chips {sorted(out)} "
            "taken out by faults since)",
        )


# ---------------------------------------------------------------------- API load and admission

# The agent's API requests in any minute of a soak, counted by the API server's audit log (docs/testing.md, "The chaos
# soak": measured, with its margin). Most are the faults' own: a reset costs about 10 (the reset handshake's ConfigMap,
# Node Events, the slices written twice), and the soak makes about one every 5 s.
MAX_REQUESTS_PER_MINUTE = 200
RESTART_NEAR_S = 10.0  # an admission refused this close to an agent or kubelet restart may be the restart's


@dataclass(frozen=True)
class Request:
    """One API request of the agent, as the API server's audit log recorded it."""

    at: float
    verb: str
    uri: str


def requests_per_minute(
    invariant: Invariant, requests: Sequence[Request], end: float, limit: int = MAX_REQUESTS_PER_MINUTE
) -> None:
    """In each minute of the soak (0-60 s, 60-120 s, ...; the last one part of a minute) the agent made at most
    `limit` API requests; a violation names the minute's most frequent requests."""
    minute = 0
    while minute * 60.0 < end:
        inside = [r for r in requests if minute * 60.0 <= r.at < (minute + 1) * 60.0]
        counts: dict[str, int] = {}
        for request in inside:
            what = f"{request.verb} {request.uri.split('?')[0]}"
            counts[what] = counts.get(what, 0) + 1
        top = ", ".join(f"{n} x {what}" for what, n in sorted(counts.items(), key=lambda i: -i[1])[:3])
        invariant.check(
            len(inside) <= limit, minute * 60.0, f"{len(inside)} API requests in minute {minute} (max {limit}): {top}"
        )
        minute += 1


@dataclass(frozen=True)
class Failure:
    """A pod the kubelet failed (phase Failed), with the reason and message of its status."""

    at: float
    pod: str
    reason: str
    message: str


# What the kubelet says when a pod is refused for want of a chip: the chips the soak broke (out of service, so fewer
# than the scheduler counted), which the agent rightly reports.
NO_CHIP_LEFT = ("requested number of devices unavailable", "no healthy devices present")
# What it says while the agent or the kubelet is restarting: the plugin not registered (yet), its socket gone.
RESTARTING = ("unregistered device", "code = Unavailable", "endpoint not found", "resource not registered")


# What the agent's Allocate says of a device a fault broke after the kubelet chose it (its view lags the agent's by a
# device list): refusing it is right ("broken not given"), and the kubelet fails the pod.
JUST_BROKEN = ("is Unhealthy",)


def admission_failures(
    invariant: Invariant,
    failures: Iterable[Failure],
    restarts: Sequence[tuple[float, float]],
    broken: Sequence[Broken] = (),
) -> None:
    """No pod fails admission for a reason the agent caused: a failed pod is rightly failed only for want of a
    chip (the soak broke them), while the agent or the kubelet restarted (within RESTART_NEAR_S of one), or for a
    device a fault broke within GRACE_S (and the soak's tick) before, which the kubelet's view did not show yet."""
    for failure in failures:
        text = f"{failure.reason}: {failure.message}"
        no_chip = failure.reason.startswith("OutOf") or any(words in text for words in NO_CHIP_LEFT)
        near = any(begin - RESTART_NEAR_S <= failure.at <= end + RESTART_NEAR_S for begin, end in restarts)
        # a kubelet restarting as a pod starts may fail it without a word (its sandbox gone, restartPolicy Never)
        silent = not failure.reason and not failure.message
        restarting = near and (silent or any(words in text for words in RESTARTING))
        just = any(0.0 <= failure.at - w.since <= GRACE_S + 1.0 for w in broken)
        just_broken = just and any(words in text for words in JUST_BROKEN)
        invariant.check(no_chip or restarting or just_broken, failure.at, f"{failure.pod} failed: {text}")
