"""The soak's model of broken chips: a window per fault from when the simulated hardware broke a chip until what heals
it (a reset, an operator's return, the fault's clearing), kept open while it lasts and closed in the runner's list of
`Broken` windows the checker judges by. Pure (nothing of the cluster), so that the unit tests can hold the model to
what the agent may rightly do.

An XID is the one fault only the agent remembers: the hardware reports it once. When the node-health record is made
unreadable and the agent restarted, either the pod acting for the node wrote the record again first (it does at
once, from what it knows: every chip it keeps out stays out) or the kill came first and the new pod starts from the
hardware (the XIDs forgotten, the chips back in service). Both are right, and which one happened is up to timing, so
each forgotten XID becomes a window that may have been forgotten (`maybe`): "broken not given" does not judge it,
and its chip is not expected back in service until a reset or a return heals it, or it is seen in service again.

The hardware's side has one such doubt too: a reset heals the chip, but the soak sees it only at its next look, and
until then the devices file still lists the chip's XIDs; an agent process that began listening meanwhile (a pod on
standby taking over, a restarted one) was sent them, and rightly takes the chip for broken again. Those XIDs become
windows the agent may have been sent (`maybe` too), healed as the XID needs or once the chip is seen in service.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import replace

from .checker import Broken

# A chip that may have been forgotten counts as forgotten once it is seen in service this long after: the node's
# allocatable may still show what the agent served before the restart for one node-status update (10 s).
SEEN_AFTER_S = 10.0
# A chip broken this recently may still count in the node's allocatable: the agent's health poll, then the node's
# status, updated every 10 s.
STATUS_LAG_S = 12.0

# After a switch back to the soak's mode, what the node showed of the mode's last process may linger this long.
AWAY_AFTER_S = 5.0

Span = tuple[float, float]
Window = tuple[int, float, str, str]  # (chip, since, heals by: reset|return|clear|either, why)
OFF_BUS = "fell off the bus"  # the why of a chip's window while it is gone from the bus
Healthy = Callable[[int], bool]  # chip -> whether it counts as healthy


def listening_began(starts: Collection[tuple[float, float | None]], since: float) -> bool:
    """Whether an agent process may have begun listening for XIDs at `since` or later: `starts` are the spans in
    which one may (a restart until its pod is Ready, a rollout until it is done: None, not yet)."""
    return any(end is None or end >= since for _, end in starts)


class Windows:
    def __init__(self, broken: list[Broken]) -> None:
        self.broken = broken  # the runner's: every window, open or closed, for the checker and the report
        self.open: list[Window] = []
        self.maybe: set[tuple[int, float]] = set()  # (chip, since) of the open windows the agent may have forgotten

    def add(self, chip: int, since: float, heals_by: str, why: str, maybe: bool = False) -> None:
        self.open.append((chip, since, heals_by, why))
        self.broken.append(Broken(chip, since, None, why, maybe))
        if maybe:
            self.maybe.add((chip, since))

    def close(self, match: Callable[[int, float, str, str], bool], at: float, how: str) -> None:
        for window in [w for w in self.open if match(*w)]:
            self.open.remove(window)
            chip, since = window[0], window[1]
            index = next(i for i, b in enumerate(self.broken) if b.chip == chip and b.since == since)
            self.broken[index] = replace(self.broken[index], until=at, why=f"{window[3]}, {how}")
            self.maybe.discard((chip, since))

    def awaits_reset(self, chip: int, at: float) -> None:
        """An operator returned the chip: what waited for the return now waits for the reset the agent makes."""
        returned = f"returned at {at:.1f}"
        self.open = [
            (ch, since, "reset", f"{why}, {returned}")
            if ch == chip and by in ("return", "either")
            else (ch, since, by, why)
            for ch, since, by, why in self.open
        ]

    def to_operator(self, chip: int, since: float = float("-inf")) -> None:
        """The chip's resets are spent: what waited for a reset (opened at `since` or later) now waits for an
        operator's return."""
        self.open = [(ch, at, "return" if ch == chip and at >= since and by in ("reset", "either") else by, why)
                     for ch, at, by, why in self.open]  # fmt: skip

    def forget_xids(self, at: float, why: str) -> None:
        """The agent's record made unreadable: each chip's open XID windows end here, and one window it may have
        forgotten opens in their place, healed by a return if any of them waited for one, by either if one may have
        (the reset limit), else by a reset."""
        xids = [w for w in self.open if w[3].startswith("XID")]
        self.close(lambda *window: window in xids, at, why)
        for chip in sorted({w[0] for w in xids}):
            mine = [w for w in xids if w[0] == chip]
            by = {w[2] for w in mine}
            heals_by = "return" if "return" in by else "either" if "either" in by else "reset"
            self.add(chip, at, heals_by, f"{'; '.join(w[3] for w in mine)}; maybe forgotten", maybe=True)

    def seen_back(self, at: float, in_service: Callable[[int], bool], away: Collection[Span] = ()) -> None:
        """The windows the agent may have forgotten whose chip is in service SEEN_AFTER_S or more after: it forgot
        them (one it remembered stays out of service until a reset or a return). Not while the soak's mode is
        switched away (`away`: (since, back)), nor AWAY_AFTER_S after: what the node shows then is what the last
        process of the soak's mode left before the switch (DRA: the slices the kubelet has not wiped yet), not what
        the agent knows now."""
        if any(since <= at <= back + AWAY_AFTER_S for since, back in away):
            return

        def forgotten(chip: int, since: float, by: str, why: str) -> bool:
            return (chip, since) in self.maybe and at - since >= SEEN_AFTER_S and in_service(chip)

        self.close(forgotten, at, "in service again: the agent forgot it")

    def doubt(self, chip: int, at: float) -> None:
        """A reset ending at `at` may or may not have healed the chip (it ended by a lie's edge): what it would heal
        becomes one window in doubt, healed by either a reset or a return (the agent may have found the reset
        unproven and left the chip to an operator), or once the chip is seen in service."""
        doubted = [w for w in self.open if w[0] == chip and w[1] < at and w[2] in ("reset", "either")]
        if not doubted:
            return
        self.close(lambda *window: window in doubted, at, f"maybe healed by the reset ending at {at:.1f}")
        self.add(chip, at, "either", f"{'; '.join(w[3] for w in doubted)}; maybe not reset", maybe=True)

    def maybe_sent_again(self, chip: int, at: float, xids: list[int], operator_xids: Collection[int]) -> None:
        """A reset ending at `at` healed the chip, but the soak saw it late and a process may have begun listening
        since: it may have been sent these XIDs, which the file still listed, and keep the chip out for them. One
        window (a window is known by its chip and start), healed by a return if one of them needs an operator."""
        heals_by = "return" if set(xids) & set(operator_xids) else "reset"
        why = "; ".join(f"XID {xid}" for xid in xids)
        self.add(chip, at, heals_by, f"{why}; maybe sent again after the reset", maybe=True)

    def counted_in(self, allocatable: int, chip: int, at: float, units_of: Callable[[Healthy], int]) -> bool:
        """Device plugin: whether the chip is in service, as far as one count tells: allocatable reaches what every
        chip not certainly broken gives, and is more than the other chips could give, a chip broken less than
        STATUS_LAG_S ago counting as one the node may still show (its allocatable lags the agent)."""

        def shown(other: int) -> bool:
            since = min((s for c, s, _, _ in self.open if c == other and (c, s) not in self.maybe), default=None)
            return since is None or at - since < STATUS_LAG_S

        serving = units_of(lambda other: not self.certainly_broken(other))
        return allocatable >= serving and allocatable > units_of(lambda other: other != chip and shown(other))

    def opened_since(self, chip: int, at: float) -> set[str]:
        """Why each of the chip's open windows that opened at `at` or later is open: a reset seen late (a step held
        the soak up) that ended at `at` heals none of them."""
        return {why for ch, since, _, why in self.open if ch == chip and since >= at}

    def waits_for_return(self, chip: int, present: bool) -> bool:
        """The agent certainly waits for an operator's return of the chip (it takes the return: the chip's count of
        resets cleared, the reset it makes the operator's): a window only a return heals is open for it, but for its
        fall off the bus once it is `present` again. "Not present" keeps a chip out only while it stands (README,
        "Self-healing GPUs"): back on the bus, the agent may put it back in service, or reset it for its other faults
        as its own (counted), before the return lands; then it ignores the return (the chip waits for none). A window
        the agent may have forgotten makes no return certain either."""

        def certain(ch: int, since: float, by: str, why: str) -> bool:
            return ch == chip and by == "return" and (ch, since) not in self.maybe

        return any(certain(*w) and not (present and w[3].startswith(OFF_BUS)) for w in self.open)

    def certainly_broken(self, chip: int) -> bool:
        return any(w[0] == chip and (w[0], w[1]) not in self.maybe for w in self.open)

    def still_broken_xids(self) -> dict[int, list[int]]:
        """The XIDs a new agent process is sent again (a broken chip goes on reporting; healed ones don't): those of
        the open windows, but the ones the agent may have forgotten (the hardware has nothing more to say of them)."""
        found: dict[int, list[int]] = {}
        for chip, since, _, why in self.open:
            if (chip, since) not in self.maybe and (xid := re.match(r"XID (\d+)", why)):
                found.setdefault(chip, []).append(int(xid.group(1)))
        return found
