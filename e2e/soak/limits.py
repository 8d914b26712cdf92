"""The agent's reset limit and its attempts per fault, as the soak models them from outside (pure: nothing of the
cluster, nothing of the agent), and the checker's rules over them.

The agent (README, "The reset limit") counts one reset per fault episode (a chip's time out of service), taken when
the episode's first automatic reset starts; a chip whose count reached health.resetLimit (2, the chart's default,
within health.resetWindow, a day: longer than any soak) is not reset at its next resettable fault but left to an
operator (GPUResetLimitReached, on the Node) until one returns it, which clears the count; the reset the return asks
for is the operator's, not counted. A fault episode gets 3 attempts (backoff 10 s, 20 s); a reset that exits 0 but
is not proven (a lying ixsmi) is a failed attempt; after the third the chip needs an operator.

What the soak cannot know for certain it keeps as a range [lo, hi] per chip: after the node-health record was made
unreadable (the agent may have forgotten the count), after a fault within NEAR_S of the chip's last reset (the
agent may take it for the same episode, its proof not done), after a return the agent may have ignored (the chip
was not waiting for an operator). A fault judged with lo at the limit leaves the chip to an operator for certain
(LIMITED: no reset of it until the soak returns it, one reset after); with only hi at the limit, either may happen
(EITHER: healed by a reset or by the return the soak makes RETURN_AFTER_S later; not judged).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .checker import Invariant, Reset, ServiceSample

LIMIT = 2  # the agent's health.resetLimit: the chart's default, which the soak keeps
ATTEMPTS = 3  # resets of one fault before the chip needs an operator
NEAR_S = 3.0  # a fault this soon after its chip's last reset ended may be that reset's episode (its proof)
RETURN_AFTER_S = 15.0  # the soak's operator returns a chip left to one this long after
LIE_LAG_S = 12.0  # after a lying reset ended: the node's allocatable (node status, 10 s) shows the chip out
RESET, LIMITED, EITHER = "reset", "limited", "either"


@dataclass
class Count:
    """What the soak knows of one chip's count of resets and of its episode now."""

    lo: int = 0
    hi: int = 0
    counted: bool = False  # the episode's first automatic reset was seen
    maybe_same: bool = False  # its next first reset may add nothing (or, after a forgetting, one more)
    operator: bool = False  # its next reset is the one an operator asked for: not counted
    attempts: int = 0  # resets of the episode that ended without healing it
    limited: float | None = None  # since when it is certainly left to an operator by the limit
    last_end: float = float("-inf")  # when its last reset that healed it ended


@dataclass
class Span:
    """A chip certainly left to an operator by the limit from `since` until the soak returned it (None: not yet)."""

    chip: int
    since: float
    until: float | None = None


class ResetCounts:
    def __init__(self, chips: int, limit: int = LIMIT) -> None:
        self.limit = limit
        self.chips = [Count() for _ in range(chips)]
        self.limited: list[Span] = []  # for "no reset while limited"
        self.returns: list[Span] = []  # returns of a certainly limited chip, until healed: "one reset per return"

    def fault(self, chip: int, at: float, open_by: set[str]) -> str:
        """A fault a reset clears on the chip at `at`, whose open windows heal by open_by: what the agent does."""
        count = self.chips[chip]
        if count.limited is not None:
            return LIMITED
        if open_by and open_by <= {RESET}:
            return RESET  # the episode under way: its reset heals this too
        if open_by:  # other causes keep it out: the agent asks the limit once only those a reset clears are left
            return EITHER if count.hi >= self.limit else RESET
        near = at - count.last_end < NEAR_S
        count.maybe_same = count.maybe_same or near
        if count.lo >= self.limit and not near:
            count.limited = at
            self.limited.append(Span(chip, at))
            return LIMITED
        return EITHER if count.hi >= self.limit else RESET

    def reset_seen(self, chip: int, healed: bool) -> bool:
        """A reset of the chip, in an open episode, ended (healed: it healed the chip); True when the chip now needs an
        operator for certain (its attempts spent, or the reset an operator asked for failed)."""
        count = self.chips[chip]
        if count.operator:
            count.operator = False
            return not healed
        if count.limited is not None:
            return False  # a reset it should not have had: "no reset while limited" reports it
        if not count.counted:
            count.counted = True
            if count.maybe_same:
                count.hi = max(count.hi, min(count.hi, self.limit - 1) + 1)
            else:
                count.hi = min(count.hi, self.limit - 1) + 1
                count.lo = min(count.lo + 1, count.hi)
            count.maybe_same = False
        if not healed:
            count.attempts += 1
        return not healed and count.attempts >= ATTEMPTS

    def may_count_again(self, chip: int) -> None:
        """An XID a reset healed may have been sent again to a process that began listening: one that was takes it
        for a new fault, whose first reset counts; one that was not adds nothing."""
        self.chips[chip].maybe_same = True

    def unexplained(self, chip: int) -> None:
        """A reset of the chip in no episode the soak knows: a fault it did not cause (an XID a new agent process was
        sent again for a chip it took for broken, its reset's end not seen yet) may have made an episode of the
        agent's own, which it counted: the count may be one more."""
        count = self.chips[chip]
        if count.limited is None:
            count.hi = min(count.hi + 1, self.limit)

    def healed(self, chip: int, at: float) -> None:
        """Every window of the chip closed by a reset ending at `at`: its episode is over."""
        count = self.chips[chip]
        count.counted, count.maybe_same, count.operator, count.attempts, count.last_end = False, False, False, 0, at
        for span in self.returns:
            if span.chip == chip and span.until is None:
                span.until = at

    def returned(self, chip: int, at: float, certain: bool) -> None:
        """The soak's operator returned the chip; certain: it was waiting for one (the agent clears its count and
        makes one reset, not counted), else the agent may have ignored the return."""
        count = self.chips[chip]
        for span in [*self.limited, *self.returns]:
            if span.chip == chip and span.until is None:
                span.until = at
        if count.limited is not None:
            self.returns.append(Span(chip, at))
        count.limited, count.attempts = None, 0
        if certain:
            count.lo = count.hi = 0
            count.counted, count.operator, count.maybe_same = True, True, False
        else:
            count.lo, count.counted, count.maybe_same, count.operator = 0, False, True, False

    def forget(self, at: float) -> None:
        """The node-health record made unreadable: the agent may have forgotten every count and limit."""
        for chip, count in enumerate(self.chips):
            for span in self.limited:
                if span.chip == chip and span.until is None:
                    span.until = at
            count.lo, count.limited, count.counted, count.maybe_same, count.operator = 0, None, False, True, False


def no_reset_while_limited(invariant: Invariant, resets: Iterable[Reset], spans: Sequence[Span], end: float) -> None:
    """A chip the limit left to an operator is not reset until the operator returns it (one check per span)."""
    resets = list(resets)
    for span in spans:
        until = end if span.until is None else span.until
        bad = [r for r in resets if span.chip in r.chips and span.since < r.started < until]
        what = f"chip {span.chip} left to an operator by the reset limit at {span.since:.1f} was reset at "
        invariant.check(not bad, span.since, what + ", ".join(f"{r.started:.1f}" for r in bad))


def one_reset_per_return(invariant: Invariant, resets: Iterable[Reset], spans: Sequence[Span], end: float) -> None:
    """A chip the limit left to an operator comes back after the one reset the operator's return asks for."""
    resets = list(resets)
    for span in spans:
        until = end if span.until is None else span.until
        runs = [r for r in resets if span.chip in r.chips and span.since <= r.started <= until]
        what = f"chip {span.chip} returned at {span.since:.1f} after the reset limit: {len(runs)} resets, not one"
        invariant.check(len(runs) <= 1, span.since, what)


def not_back_while_lying(invariant: Invariant, sample: ServiceSample, out: frozenset[int], ceiling: int | None) -> None:
    """A chip whose reset lied (ixsmi exited 0, the chip was not reset) stays out of service: DRA, not untainted in
    the slice; device plugin, allocatable at most `ceiling`, what the other chips give."""
    if not out:
        return
    if sample.in_service is not None:
        back = sorted(out & sample.in_service)
        invariant.check(not back, sample.at, f"chips {back} in service after a reset that lied")
    elif sample.allocatable is not None and ceiling is not None:
        what = f"allocatable {sample.allocatable} > {ceiling}: chips {sorted(out)} counted after a reset that lied"
        invariant.check(sample.allocatable <= ceiling, sample.at, what)


def lying_at(lies: Sequence[tuple[int, float, float | None]], chip: int, ended: float, margin: float = 1.0) -> bool:
    """Whether a reset of the chip ending at `ended` certainly lied. The backend reads the devices file's `reset:`
    after ixsmi's run ended (its end logged first), within `margin`; a lie is written to the file before its start
    is noted, and its end too: a reset ending at or after a lie's start, and `margin` or more before its end, read
    the lie."""
    return any(c == chip and since <= ended and (until is None or ended <= until - margin) for c, since, until in lies)


def honest_at(lies: Sequence[tuple[int, float, float | None]], chip: int, ended: float, margin: float = 1.0) -> bool:
    """Whether a reset of the chip ending at `ended` certainly did not lie: it ended `margin` or more before each of
    the chip's lies began (the file read before the lie was written), or at or after its end."""
    return all(
        c != chip or ended <= since - margin or (until is not None and ended >= until) for c, since, until in lies
    )
