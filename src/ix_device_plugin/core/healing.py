"""Self-healing, as pure rules: where each chip out of service stands, and what comes next.

A chip's `Care` is its health story: in service, or out of service and why, what the agent does about it (wait for
no container to hold it, reset it, leave it to an operator) and what came of the last step. The healer (healing/)
feeds it what it sees and does; these functions say the next Care. No clocks are read here: `now` is given.

    healthy -> waiting (a reset clears it; once the chip is free) -> resetting -> healthy (back in service)
                                                                              -> waiting (failed: after a backoff)
                                                                              -> operator (the last attempt failed)
    healthy -> operator (a reset cannot clear it)      operator -> waiting (an operator asked for one more reset)
    healthy -> out (a problem no reset fixes and that clears by itself)     healthy -> off (self-healing is off)
    healthy -> operator (the reset limit: reset too often within its window; `limited`)

The reset limit (ResetLimit: health.resetLimit resets within health.resetWindow) bounds the automatic resets. Each
chip keeps the times of its resets, one per fault (an episode out of service), taken when the first reset of the
episode starts: a reset the handshake refused, or that found the chip held, reset nothing and gives its time back;
the retries of an episode and a reset cut short that is done again add none. A chip that goes out of service for a
cause a reset clears while its history holds the limit's count within the window is not reset: it needs an operator
(`limited`), and stays so, whatever the window says later, until it is healthy again or an operator returns it. An
operator's return clears the history, and the reset it asks for is the operator's, not counted. The times are
wall-clock (Unix) times, unlike the others here, since they outlive a restart and a reboot in the node-health
record: the caller hands in `wall_now` beside the monotonic `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ix_device_plugin.core.inventory import ChipStatus
from ix_device_plugin.settings.health import NOT_PRESENT, OPERATOR, RESET, HealthPolicy, xid_name
from ix_device_plugin.settings.table import default
from ix_device_plugin.settings.values import MAX_RESET_LIMIT

HEALTHY, OUT, WAITING, RESETTING, NEEDS_OPERATOR, OFF = "healthy", "out", "waiting", "resetting", "operator", "off"
PHASES = (HEALTHY, OUT, WAITING, RESETTING, NEEDS_OPERATOR, OFF)
CUT_SHORT_CAUSE = "its last reset was cut short"  # a chip still reserved by a reset that did not finish
UNAVAILABLE_NOTE = "cannot be reset here"  # the note of a chip left for an operator: no reset can work on this node
MAX_RESETS = MAX_RESET_LIMIT  # reset times a chip keeps: the newest (a limit is never above it)


@dataclass(frozen=True)
class Rules:
    """How hard the healer tries: resets per episode, the backoff between them, and the settling time."""

    attempts: int = 3
    backoff: float = 10.0  # seconds after the first failed reset, doubled after each
    backoff_cap: float = 300.0
    refused_wait: float = 60.0  # after a reset the handshake refused (nothing was reset): not counted as an attempt
    settle: float = 1.0  # a chip just taken out is not reset before this: an Allocate answered just before it lands

    def delay(self, failed: int) -> float:
        """Seconds before the next attempt after `failed` failed ones."""
        return min(self.backoff_cap, self.backoff * 2 ** max(0, failed - 1))


@dataclass(frozen=True)
class ResetLimit:
    """At most count resets of a chip (one per fault) within window seconds; count 0: no limit."""

    count: int = default("reset_limit")
    window: float = default("reset_window")

    def recent(self, resets: tuple[float, ...], wall_now: float) -> tuple[float, ...]:
        """The reset times within the window before wall_now (one in the future, a clock set back, counts)."""
        return tuple(when for when in resets if when > wall_now - self.window)

    def reached(self, resets: tuple[float, ...], wall_now: float) -> bool:
        """True when a chip with these reset times is not reset again automatically."""
        return self.count > 0 and len(self.recent(resets, wall_now)) >= self.count


NO_LIMIT = ResetLimit(count=0)


@dataclass(frozen=True)
class Diagnosis:
    """A chip's reasons for being out of service, by what is done about them."""

    resettable: tuple[str, ...] = ()  # a reset clears them
    operator: tuple[str, ...] = ()  # a reset cannot: the chip waits for an operator, or for them to clear
    other: tuple[str, ...] = ()  # problems no reset is for (a device node missing, a failing health call)

    @property
    def healthy(self) -> bool:
        """True when nothing keeps the chip out of service."""
        return not (self.resettable or self.operator or self.other)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Every reason, resettable ones first."""
        return (*self.resettable, *self.operator, *self.other)


def diagnose(status: ChipStatus, policy: HealthPolicy) -> Diagnosis:
    """Why the chip is out of service under policy, sorted by what is done about each reason."""
    named = {NOT_PRESENT, *status.errors, *map(xid_name, status.xids)}
    resettable, operator, other = [], [], []
    for reason in status.own.reasons(policy):
        if reason not in named:
            other.append(reason)
        elif policy.action(reason) == RESET:
            resettable.append(reason)
        elif policy.action(reason) == OPERATOR:
            operator.append(reason)
    return Diagnosis(tuple(resettable), tuple(operator), tuple(other))


@dataclass(frozen=True)
class Care:
    """One chip's health story: where it stands, why, and what came of the last step."""

    uuid: str
    minor: int | None = None
    phase: str = HEALTHY
    causes: tuple[str, ...] = ()  # what keeps it out of service
    attempts: int = 0  # resets tried since it went out (the one under way included)
    retry_at: float = 0.0  # monotonic time before which it is not reset
    out_since: float | None = None  # monotonic time it went out of service
    note: str = ""  # the last step and its outcome
    operator_return: bool = False  # an operator asked for one more reset
    returned_for: tuple[str, ...] | None = None  # its causes when the operator asked (None: not known)
    resets: tuple[float, ...] = ()  # Unix times of the resets started for its faults (one each), oldest first
    limited: bool = False  # it needs an operator because the reset limit was reached

    @property
    def name(self) -> str:
        """`GPU 1 (GPU-...)`: the chip's index (its minor) and UUID, as Events and logs name it."""
        return f"GPU {'?' if self.minor is None else self.minor} ({self.uuid})"


def observe(care: Care, diagnosis: Diagnosis, now: float, rules: Rules, healing: bool, cut_short: bool = False, *,
            limit: ResetLimit = NO_LIMIT, wall_now: float = 0.0) -> Care:  # fmt: skip
    """care after the chip was seen with diagnosis (healing: self-healing is on). A reset under way keeps its
    phase: its outcome decides what follows. limit: the reset limit in force; wall_now: Unix time, for it.

    cut_short: the chip is still reserved by a reset that did not finish (the agent stopped during it). It may be
    half reset, whatever its health reads now, so it is reset again before it is back in service: a reset cut short
    is a cause a reset clears."""
    if care.phase == RESETTING:
        return care
    if cut_short and CUT_SHORT_CAUSE not in diagnosis.resettable:
        diagnosis = replace(diagnosis, resettable=(*diagnosis.resettable, CUT_SHORT_CAUSE))
    if diagnosis.healthy:
        if care.phase == HEALTHY:
            return care
        return Care(care.uuid, care.minor, note="back in service", resets=care.resets)
    out_since = care.out_since if care.out_since is not None else now
    care = replace(care, causes=diagnosis.reasons, out_since=out_since)
    if care.operator_return and care.phase == WAITING:
        return care  # one more reset, whatever the causes
    if diagnosis.operator:
        if care.phase == NEEDS_OPERATOR and (care.limited or left_unreset(care)):
            return care  # left to an operator for a reason of its own, which its note keeps saying (and decides on)
        return replace(care, phase=NEEDS_OPERATOR, note=f"needs an operator: {', '.join(diagnosis.operator)}")
    if not diagnosis.resettable:
        return replace(care, phase=OUT, note=f"out of service until it clears: {', '.join(diagnosis.other)}")
    if care.phase == NEEDS_OPERATOR and (care.attempts >= rules.attempts or care.limited or left_unreset(care)):
        return care
    if not healing:
        return replace(care, phase=OFF, note="self-healing is off: it stays out of service")
    if care.phase == WAITING:
        return care
    if limit.reached(care.resets, wall_now):
        return limit_reached(care, limit, wall_now)
    return replace(care, phase=WAITING, retry_at=max(care.retry_at, now + rules.settle), note="reset once free")


def limit_reached(care: Care, limit: ResetLimit, wall_now: float) -> Care:
    """care's chip was reset limit.count times within limit.window: it is left to an operator."""
    count = len(limit.recent(care.resets, wall_now))
    note = f"reset {count} times within {span(limit.window)}: not reset again automatically"
    return replace(care, phase=NEEDS_OPERATOR, limited=True, note=note)


def span(seconds: float) -> str:
    """A window as people say it: `24h`, `90m`, `45s`."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def due(care: Care, now: float) -> bool:
    """True when care's chip is to be reset now, if no container holds it."""
    return care.phase == WAITING and now >= care.retry_at


def held(care: Care, holder: str, look_again: float) -> Care:
    """care's chip was due but holder holds it: it waits, and is looked at again at look_again (monotonic)."""
    return replace(care, retry_at=look_again, note=f"waiting to be reset: held by {holder}")


def started(care: Care, wall_now: float) -> Care:
    """A reset of care's chip has started (wall_now: Unix time): the first of its episode is one in its history."""
    attempts = care.attempts + 1
    resets = (*care.resets, wall_now)[-MAX_RESETS:] if _first(care) else care.resets
    return replace(care, phase=RESETTING, attempts=attempts, resets=resets, note=f"resetting (attempt {attempts})")


def taken_back(care: Care) -> Care:
    """The reset of care's chip that started reset nothing (refused, or the chip found held at the last look): it
    waits again, and its attempt, and its place in the history if it took one, are given back."""
    back = replace(care, phase=WAITING, attempts=max(0, care.attempts - 1))
    return replace(back, resets=care.resets[:-1]) if _first(back) and care.resets else back


def _first(care: Care) -> bool:
    """True when the next reset of care's chip is the first automatic one of its episode (not an operator's)."""
    return care.attempts == 0 and not care.operator_return


def failed(care: Care, why: str, now: float, rules: Rules) -> Care:
    """The reset failed (or the chip is still unhealthy after it): try again after a backoff, or give up. The reset
    an operator asked for is the last: its chip's automatic attempts count as spent, so that it waits for an
    operator again however it came to need one (the reset limit, an XID only an operator clears) and whatever its
    causes read next (the record keeps the count across restarts)."""
    if care.operator_return or care.attempts >= rules.attempts:
        tried = "the reset an operator asked for" if care.operator_return else f"{care.attempts} resets"
        spent = max(care.attempts, rules.attempts)
        note = f"needs an operator: {tried} failed: {why}"
        return replace(care, phase=NEEDS_OPERATOR, operator_return=False, attempts=spent, note=note)
    delay = rules.delay(care.attempts)
    return replace(care, phase=WAITING, retry_at=now + delay, note=f"reset failed: {why}; next attempt in {delay:g}s")


def refused(care: Care, why: str, now: float, rules: Rules) -> Care:
    """Nothing was reset (another IXML user did not let go, the handshake failed): not an attempt; try again later.
    A reset refused once started gives its attempt back; one refused before it started (the node's reset turn, the
    record's write) had taken none."""
    return replace(
        taken_back(care) if care.phase == RESETTING and care.attempts > 0 else care,
        phase=WAITING,
        retry_at=now + rules.refused_wait,
        note=f"reset refused: {why}; trying again in {rules.refused_wait:g}s",
    )


def reset_done(care: Care, after: Diagnosis, now: float, rules: Rules) -> Care:
    """The reset worked and the chip's health was read again: back in service, or a failed attempt."""
    if after.healthy:
        note = f"back in service after a reset (attempt {care.attempts})"
        return Care(care.uuid, care.minor, note=note, resets=care.resets)
    return failed(replace(care, causes=after.reasons), f"still unhealthy after the reset: {', '.join(after.reasons)}",
                  now, rules)  # fmt: skip


def unavailable(care: Care, why: str) -> Care:
    """No reset can work here as the agent is deployed (why: what is missing, and what provides it): the chip waits
    for an operator, who resets it by hand and returns it; nothing was tried."""
    return replace(care, phase=NEEDS_OPERATOR, operator_return=False, note=f"{UNAVAILABLE_NOTE}: {why}")


def left_unreset(care: Care) -> bool:
    """True for a chip left for an operator because no reset can work here."""
    return care.phase == NEEDS_OPERATOR and care.note.startswith(UNAVAILABLE_NOTE)


def returned_by_hand(care: Care, after: Diagnosis) -> Care:
    """An operator returned the chip where no reset can work (they reset it by hand): back in service if its
    health reads clear once the XIDs seen before are forgotten, else it waits for them again."""
    if after.healthy:
        return Care(care.uuid, care.minor, note="back in service: returned by an operator")
    still = ", ".join(after.reasons)
    return replace(
        care,
        phase=NEEDS_OPERATOR,
        operator_return=False,
        causes=after.reasons,
        note=f"{UNAVAILABLE_NOTE}, and an operator returned it still unhealthy: {still}",
    )


def shown(care: Care) -> str:
    """A word for what is done about the chip, where it is published (a DRA device taint's value): being reset, or
    waiting for an operator and why; "" otherwise (a chip waiting for its reset says so by its unhealthy taint alone:
    each word costs a write of the slice)."""
    if care.phase == NEEDS_OPERATOR:
        return (
            "reset-unavailable" if left_unreset(care) else "reset-limit-reached" if care.limited else "needs-operator"
        )
    return "resetting" if care.phase == RESETTING else ""


def operator_asked(care: Care) -> Care:
    """An operator asked to return the chip: one more reset and health check, if it is out for good. Its history of
    resets is cleared (the reset asked for is not counted in it): the chip starts again as if new."""
    if care.phase not in (NEEDS_OPERATOR, OFF):
        return care
    note = "an operator asked to return it: one more reset"
    return replace(
        care,
        phase=WAITING,
        retry_at=0.0,
        operator_return=True,
        returned_for=care.causes,
        resets=(),
        limited=False,
        note=note,
    )


def not_returned(care: Care, diagnosis: Diagnosis) -> tuple[str, ...]:
    """The errors that need an operator and that the operator's return did not cover: reported after they asked
    (an operator who returns a chip vouches for what it had then, not for a fault that came while it waited)."""
    if not care.operator_return or care.returned_for is None:
        return ()
    return tuple(reason for reason in diagnosis.operator if reason not in care.returned_for)


def returned_too_early(care: Care, late: tuple[str, ...]) -> Care:
    """care after an error that needs an operator came since the operator asked to return it: no reset, it waits
    for an operator again."""
    note = f"needs an operator: {', '.join(late)} reported since an operator asked to return it"
    return replace(care, phase=NEEDS_OPERATOR, operator_return=False, returned_for=None, note=note)
