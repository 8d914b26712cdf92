"""The soak's model of healing: each broken chip's window, what the agent's resets (read from the ixsmi stand-in's
log) heal of it, the reset limit and its attempts, and the resets that lied; with the invariants judged by them."""

from __future__ import annotations

from collections.abc import Mapping

from . import checker as c
from . import limits
from .hardware import Hardware
from .later import Later
from .observe import read_resets
from .returns import Returns
from .schedule import OPERATOR_XID, RESET_XIDS
from .timeline import Timeline
from .view import ModeView
from .windows import Windows, listening_began

Lie = tuple[int, float, float | None]  # (chip, since, until) its resets lied


class Healing:
    def __init__(
        self,
        timeline: Timeline,
        hardware: Hardware,
        windows: Windows,
        counts: limits.ResetCounts,
        later: Later,
        returns: Returns,
        view: ModeView,
        invariants: Mapping[str, c.Invariant],
    ) -> None:
        self.timeline, self.hardware, self.windows, self.counts = timeline, hardware, windows, counts
        self.later, self.returns, self.view, self.invariants = later, returns, view, invariants
        self.lies: list[Lie] = []
        self.lied: dict[int, float] = {}  # chip -> when a reset that lied ended, while what it left broken lasts
        self.caught: set[int] = set()  # the lies (their index) in which a reset of their chip ended
        self.resets_seen = 0

    # ------------------------------------------------------------------ broken

    def broken(self, chip: int, heals_by: str, why: str) -> None:
        self.windows.add(chip, self.timeline.now(), heals_by, why)

    def is_open(self, chip: int) -> bool:
        """Whether a window of the chip is open: it is broken, as far as the soak knows."""
        return any(w[0] == chip for w in self.windows.open)

    def resettable(self, chip: int, why: str) -> None:
        """A fault a reset clears: healed by a reset, or, where the reset limit leaves the chip to an operator (or may),
        by the return the soak's operator makes RETURN_AFTER_S later."""
        open_by = {by for ch, _, by, _ in self.windows.open if ch == chip}
        outcome = self.counts.fault(chip, self.timeline.now(), open_by)
        self.broken(chip, "return" if outcome == limits.LIMITED else outcome, why)
        if outcome != limits.RESET:
            self.timeline.note(
                f"chip {chip}: {why} {'after' if outcome == limits.LIMITED else 'maybe after'} the reset limit"
            )
            self.later.after(limits.RETURN_AFTER_S, lambda: self.returns.limit_return(chip))

    def cleared(self, chip: int, how: str) -> None:
        """The chip's faults that clear by themselves are over."""
        self.windows.close(lambda ch, since, by, why: ch == chip and by == "clear", self.timeline.now(), how)

    def back_on_bus(self, chip: int, absence: str) -> None:
        """The chip's absence (the window whose why begins with `absence`) is over: it is back on the bus."""
        self.windows.close(
            lambda ch, since, by, why: ch == chip and by == "return" and why.startswith(absence),
            self.timeline.now(),
            "back on the bus",
        )

    def limited(self, chip: int) -> bool:
        """Whether the reset limit certainly left the chip to an operator."""
        return self.counts.chips[chip].limited is not None

    def forget_all(self, why: str) -> None:
        """The agent's memory of broken chips made unreadable: what only it knew (an XID) it may have forgotten
        (windows.py); what the hardware still says (bits, absence) it has not."""
        self.windows.forget_xids(self.timeline.now(), why)
        self.counts.forget(self.timeline.now())

    def unsent(self, chip: int) -> int:
        """A resettable XID the running agent was not sent for the chip (the backend sends each once a process)."""
        done = self.hardware.sent.union(*self.hardware.earlier.values())
        return next((x for x in (48, *RESET_XIDS) if (chip, x) not in done), 48)

    # ------------------------------------------------------------------ resets

    def catch_up(self) -> None:
        """The resets that ended since the last look, in order, each noted and judged as seen."""
        resets = read_resets(self.hardware.reset_log, self.hardware.chip_of, self.timeline.start)
        ended = [r for r in resets if r.ended is not None]
        for reset in ended[self.resets_seen :]:
            outcome = "ok" if reset.ok else "failed"
            self.timeline.note(
                f"agent reset chips {sorted(reset.chips)} ({reset.started:.1f}-{reset.ended:.1f} s, {outcome})"
            )
            self.reset_seen(reset)
        self.resets_seen = len(ended)

    def still_broken_xids(self) -> dict[int, list[int]]:
        """The XIDs of chips still broken, once the resets done since the last look are seen (a step that held the
        soak up let them wait): what a new agent process is sent again."""
        self.catch_up()
        return self.windows.still_broken_xids()

    def reset_seen(self, reset: c.Reset) -> None:
        """A run of ixsmi ended: one that succeeded and did not lie heals what a reset heals, and one certainly honest
        ends the chip's lie; each chip it ran for in an episode of faults counts for the reset limit and its attempts
        (limits.py)."""
        assert reset.ended is not None
        ended = reset.ended
        caught = {
            i
            for i, (chip, *_) in enumerate(self.lies)
            if chip in reset.chips and limits.lying_at([self.lies[i]], chip, ended)
        }
        self.caught |= caught
        lied = {self.lies[i][0] for i in caught}
        episode = {chip for chip in reset.chips if any(w[0] == chip and w[1] < ended for w in self.windows.open)}
        for chip in sorted(set(reset.chips) - episode):
            self.counts.unexplained(chip)
        sent_again: set[int] = set()
        if reset.ok:
            sent_again = self.healed_by_reset(reset, frozenset(reset.chips - lied))
            for chip in reset.chips:  # truly reset: an XID it may be sent again is no lie (windows.py judges it)
                if limits.honest_at(self.lies, chip, ended):
                    self.lied.pop(chip, None)
        for chip in sorted(episode):
            # a window opened as it ended (an XID maybe sent again to a new process) is an episode of its own
            healed = not any(w[0] == chip and w[1] < ended for w in self.windows.open)
            first = chip not in self.lied or not self._lie_stands(chip, self.lied[chip])
            if chip in lied and reset.ok and first:
                self.lied[chip] = ended  # the first lie of what is broken now
            if self.counts.reset_seen(chip, healed):
                self.needs_operator(chip)
            if healed:
                self.lied.pop(chip, None)
                self.counts.healed(chip, ended)
        for chip in sent_again:  # a process that takes it for a new fault resets the chip again, and counts that
            self.counts.may_count_again(chip)

    def healed_by_reset(self, reset: c.Reset, chips: frozenset[int]) -> set[int]:
        """A reset that succeeded heals what a reset heals on the simulated chips (those of `chips`: not one whose
        reset lied), and returns what an operator returned before it; the devices file no longer lists the XIDs it
        healed, which a process that began listening before the soak saw the reset may have been sent
        (windows.py): the chips so left in doubt."""
        assert reset.ended is not None
        ended, hardware = reset.ended, self.hardware
        cleared = {chip: self.bits_then(chip, ended) for chip in chips}
        unproven = self.unproven_and_faulted(cleared, ended)
        for chip, bits in cleared.items():
            for bit in bits:
                hardware.set_bit(chip, bit, False)

        # a reset ending within a second of a lie's edge may have read it: what it would heal may be healed or not
        doubtful = {chip for chip in chips if self.untrusted(chip, ended)}
        healing = chips - doubtful

        def heals(chip: int, since: float, by: str, why: str) -> bool:
            return chip in healing and since < ended and by in ("reset", "either")

        self.windows.close(heals, ended, f"healed by the reset ending at {ended:.1f}")
        for chip in sorted(doubtful):
            self.timeline.note(f"chip {chip}: the reset ending at {ended:.1f} may have lied (it ended by a lie's edge)")
            self.windows.doubt(chip, ended)
        for chip in sorted(unproven):
            self.windows.to_operator(chip, since=ended)
            self.later.after(limits.RETURN_AFTER_S, lambda chip=chip: self.returns.limit_return(chip))
        starts = [*self.timeline.starts, *((rollout.began, rollout.done) for rollout in self.timeline.rollouts)]
        sent_again = set()
        for chip in sorted(chips):
            dropped = hardware.reset_healed(chip, self.windows.still_broken_xids().get(chip, []))
            if dropped and listening_began(starts, ended):
                self.timeline.note(f"chip {chip}: XIDs {dropped} maybe sent again to a process that began listening")
                self.windows.maybe_sent_again(chip, ended, dropped, (OPERATOR_XID,))
                sent_again.add(chip)
                if OPERATOR_XID in dropped:
                    self.later.after(limits.RETURN_AFTER_S, lambda chip=chip: self.returns.limit_return(chip))
        return sent_again

    def bits_then(self, chip: int, ended: float) -> list[str]:
        """The chip's health bits a reset ending at `ended` clears (OverTemp is not one) that were set as it ended (seen
        late, a step having held the soak up: a bit set after the reset ended stays)."""
        later = self.windows.opened_since(chip, ended)
        return [bit for bit in self.hardware.bits.get(chip, ()) if bit != "OverTemp" and f"health {bit}" not in later]

    def unproven_and_faulted(self, cleared: Mapping[int, list[str]], ended: float) -> set[int]:
        """Of the chips a reset ending at `ended` clears these bits of, those whose reset an operator asked for
        (certainly) and that a fault met before the soak saw it: the agent left them to an operator. The soak clears
        a reset chip's bits as it sees the reset, after the agent read them, so a bit set as the reset ended failed
        its proof. The reset cleared the chip's XIDs, and it comes back once its bits clear, unless a fault came in
        between: the agent, its last reset spent, leaves that one to an operator."""
        unproven = sorted(chip for chip, bits in cleared.items() if bits and self.counts.chips[chip].operator)
        for chip in unproven:
            bits = ", ".join(cleared[chip])
            self.timeline.note(f"chip {chip}: the reset an operator asked for read {bits} still set: not proven")
        return {chip for chip in unproven if self.windows.opened_since(chip, ended)}

    def needs_operator(self, chip: int) -> None:
        """The chip's resets are spent (or the one an operator asked for failed): it waits for the soak's operator."""
        self.windows.to_operator(chip)
        self.timeline.note(f"chip {chip} needs an operator: its resets failed")
        self.later.after(limits.RETURN_AFTER_S, lambda: self.returns.limit_return(chip))

    # ------------------------------------------------------------------ lies

    def lie_begins(self, chip: int) -> int:
        """The chip's resets lie from now: the lie's index."""
        self.lies.append((chip, self.timeline.now(), None))
        return len(self.lies) - 1

    def lie_caught(self, index: int) -> bool:
        """Whether a reset of the lie's chip ended within it (it lied)."""
        return index in self.caught

    def untrusted(self, chip: int, ended: float) -> bool:
        """Whether a reset of the chip ending at `ended` may have lied (not certainly honest): the agent may have
        found it unproven, a failed attempt."""
        return not limits.honest_at(self.lies, chip, ended)

    def lie_over(self, index: int) -> None:
        chip, since, _ = self.lies[index]
        self.hardware.set_lying([chip], False)  # written before its end is noted: a reset ending after it was honest
        self.lies[index] = (chip, since, self.timeline.now())
        self.timeline.note(f"chip {chip}'s resets honest again")

    # ------------------------------------------------------------------ judging

    def judge_lies(self, sample: c.ServiceSample) -> None:
        """Every look: a chip whose reset lied and that is still broken is not in service (LIE_LAG_S after)."""
        at = sample.at
        self.lied = {chip: lied for chip, lied in self.lied.items() if self._lie_stands(chip, lied)}
        out = frozenset(chip for chip, lied in self.lied.items() if at >= lied + limits.LIE_LAG_S)
        if not out or self.timeline.quiet_at(at, limits.LIE_LAG_S):
            return
        invariant = self.invariants["lying reset not trusted"]
        limits.not_back_while_lying(invariant, sample, out, self.view.ceiling_without(out))

    def _lie_stands(self, chip: int, lied: float) -> bool:
        """Whether what the chip's lying reset (ending at `lied`) left broken is broken still: a window open then is
        open now. One opened since is a fault of its own (the chip fell off the bus later, say), not the lie's."""
        return any(ch == chip and since <= lied for ch, since, _, _ in self.windows.open)

    def judge_limits(self, resets: list[c.Reset], end: float) -> None:
        invariant = self.invariants["reset limit"]
        limits.no_reset_while_limited(invariant, resets, self.counts.limited, end)
        limits.one_reset_per_return(invariant, resets, self.counts.returns, end)
