"""How each kind of fault of the schedule is caused on the node, undone when its time is up, and when the chips it
broke count as healed (the windows the checker's "broken not given" and "back in service" judge by)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime

from harness.kube import KubectlError

from . import checker as c
from . import limits
from .observe import read_resets
from .run import SoakRun
from .schedule import CHIPS, FLAPPING, LYING, MODE_SWITCH, OPERATOR_XID, RESET_XIDS, Step
from .windows import OFF_BUS, Windows, listening_began

RETURN_ANNOTATION = "iluvatar.com/gpu.return"
NODE_DIR, NODE_RECORD = "iluvatar.com", "node-health.json"  # in the kubelet's plugins directory (README)
UNREADABLE = b"\x00{not json \xff"
RETURN_RETRY_S = 2.0  # a return the agent may not see now is made again this much later


class FaultActions:
    def __init__(self, soak: SoakRun) -> None:
        self.soak = soak
        self.undo: list[tuple[float, Callable[[], None]]] = []
        self.created: list[str] = []
        self.windows = Windows(soak.broken)  # what is broken and what heals it
        self.returned: dict[int, float] = {}  # chip -> when an operator returned it
        self.switched: tuple[float, int] | None = None  # while the other mode acts: (since, its quiet window's index)
        self.starts: list[tuple[float, float | None]] = []  # restarts and switches: while a new process may start
        self.counts = limits.ResetCounts(CHIPS)  # the reset limit and attempts, as far as the soak knows them
        self.lies: list[tuple[int, float, float | None]] = []  # (chip, since, until) its resets lied
        self.lied: dict[int, float] = {}  # chip -> when a reset that lied ended, while that left it broken
        self.ending = False
        self.deferred: set[int] = set()  # chips whose return waits for the agent to see the Node again

    # ------------------------------------------------------------------ windows

    def broken(self, chip: int, heals_by: str, why: str) -> None:
        self.windows.add(chip, self.soak.now(), heals_by, why)

    def close(self, match: Callable[[int, float, str, str], bool], at: float, how: str) -> None:
        self.windows.close(match, at, how)

    def reset_seen(self, reset: c.Reset) -> None:
        """A run of ixsmi ended: one that succeeded and did not lie heals what a reset heals, and one certainly honest
        ends the chip's lie; each chip it ran for in an episode of faults counts for the reset limit and its attempts
        (limits.py)."""
        assert reset.ended is not None
        ended = reset.ended
        lied = {chip for chip in reset.chips if limits.lying_at(self.lies, chip, ended)}
        episode = {chip for chip in reset.chips if any(w[0] == chip and w[1] < ended for w in self.windows.open)}
        for chip in sorted(set(reset.chips) - episode):
            self.counts.unexplained(chip)
        if reset.ok:
            self.healed_by_reset(reset, frozenset(reset.chips - lied))
            for chip in reset.chips:  # truly reset: an XID it may be sent again is no lie (windows.py judges it)
                if limits.honest_at(self.lies, chip, ended):
                    self.lied.pop(chip, None)
        for chip in sorted(episode):
            healed = not any(w[0] == chip for w in self.windows.open)
            if chip in lied and reset.ok:
                self.lied.setdefault(chip, ended)
            if self.counts.reset_seen(chip, healed):
                self.needs_operator(chip)
            if healed:
                self.lied.pop(chip, None)
                self.counts.healed(chip, ended)

    def healed_by_reset(self, reset: c.Reset, chips: frozenset[int]) -> None:
        """A reset that succeeded heals what a reset heals on the simulated chips (those of `chips`: not one whose
        reset lied), and returns what an operator returned before it; the devices file no longer lists the XIDs it
        healed, which a process that began listening before the soak saw the reset may have been sent
        (windows.py)."""
        assert reset.ended is not None
        ended = reset.ended
        for chip in chips:  # seen late (a step held the soak up): a bit set after the reset ended stays
            later = self.windows.opened_since(chip, ended)
            for bit in list(self.soak.hardware.bits.get(chip, ())):
                if bit != "OverTemp" and f"health {bit}" not in later:
                    self.soak.hardware.set_bit(chip, bit, False)

        def heals(chip: int, since: float, by: str, why: str) -> bool:
            return chip in chips and since < ended and by in ("reset", "either")

        self.close(heals, ended, f"healed by the reset ending at {ended:.1f}")
        starts = [*self.starts, *((rollout.began, rollout.done) for rollout in self.soak.rollouts)]
        for chip in sorted(chips):
            dropped = self.soak.hardware.reset_healed(chip, self.windows.still_broken_xids().get(chip, []))
            if dropped and listening_began(starts, ended):
                self.soak.note(f"chip {chip}: XIDs {dropped} maybe sent again to a process that began listening")
                self.windows.maybe_sent_again(chip, ended, dropped, (OPERATOR_XID,))
                if OPERATOR_XID in dropped:
                    self.later(limits.RETURN_AFTER_S, lambda chip=chip: self.limit_return(chip))

    def returned_awaits_reset(self, chip: int) -> None:
        """A return is no cure for an XID: the agent resets the chip once more and only a reset that succeeds brings
        it back (README, "The operator's way back"); one that fails or hangs leaves it needing an operator again. (A
        chip back on the bus is closed at its return above: its absence was a health condition, not an XID.)"""
        self.windows.awaits_reset(chip, self.soak.now())

    def forget_all(self, why: str) -> None:
        """The agent's memory of broken chips made unreadable: what only it knew (an XID) it may have forgotten
        (windows.py); what the hardware still says (bits, absence) it has not."""
        self.windows.forget_xids(self.soak.now(), why)
        self.counts.forget(self.soak.now())

    # ------------------------------------------------------------------ faults

    def do(self, step: Step) -> None:
        soak, hardware = self.soak, self.soak.hardware
        kind, chips = step.kind, step.chips
        if kind in ("xid-reset", "xid-ignored", "xid-operator", "xid-storm"):
            xids = list(step.detail.get("xids") or [step.detail["xid"]])  # type: ignore[arg-type]
            for index, chip in enumerate(chips):
                self.xid(chip, int(xids[index % len(xids)]), kind)
            if kind == "xid-operator":
                self.later(step.duration, lambda: self.operator_returns(chips[0]))
        elif kind == "health-reset-bit":
            hardware.set_bit(chips[0], str(step.detail["bit"]), True)
            self.resettable(chips[0], f"health {step.detail['bit']}")
        elif kind == FLAPPING:
            self.flap(chips[0], soak.now() + step.duration, 0)
        elif kind == LYING:
            hardware.set_lying(chips, True)
            index = len(self.lies)
            self.lies.append((chips[0], soak.now(), None))
            self.xid(chips[0], self.unsent(chips[0]), "xid-reset")
            self.later(step.duration, lambda: self.lie_over(index))
        elif kind == "health-overtemp":
            hardware.set_bit(chips[0], "OverTemp", True)
            self.broken(chips[0], "clear", "health OverTemp")
            self.later(step.duration, lambda: self.cooled(chips[0]))
        elif kind == "off-bus":
            hardware.set_present(chips[0], False)
            self.broken(chips[0], "return", OFF_BUS)
            self.later(step.duration, lambda: self.back_on_bus(chips[0]))
        elif kind in ("agent-kill", "agent-restart"):
            self.restart_agent(kill=kind == "agent-kill")
        elif kind == "kubelet-restart":
            began = soak.now()
            soak.cluster.stop_kubelet()
            soak.cluster.start_kubelet()
            soak.quiet.append((began, soak.now() + 10))
        elif kind == "ixsmi-failing":
            hardware.set_ixsmi("fail")
            self.later(step.duration, lambda: hardware.set_ixsmi("ok"))
        elif kind == "ixsmi-hanging":
            hardware.set_ixsmi("hang")
            self.later(step.duration, lambda: hardware.set_ixsmi("ok"))
        elif kind == "ixsmi-slow":
            hardware.set_ixsmi(f"slow {step.detail['seconds']}")
            self.later(step.duration, lambda: hardware.set_ixsmi("ok"))
        elif kind == "config-change":
            began, index = soak.now(), int(step.detail["config"])  # type: ignore[arg-type]
            soak.agent.set_config(index)  # returns once the pod's mounted ConfigMap says it
            soak.configs.append((soak.now(), index))
            soak.quiet.append((began, soak.now() + 5))
        elif kind in ("rollout", "rollback"):
            self.roll(kind)
        elif kind in ("node-health-unreadable", "checkpoint-unreadable"):
            self.unreadable(kind)
        elif kind == MODE_SWITCH:
            self.switch(str(step.detail["to"]))
            self.later(step.duration, lambda: self.switch(soak.mode))
        else:
            raise AssertionError(f"no way to cause {kind}")

    def xid(self, chip: int, xid: int, kind: str) -> None:
        if not self.soak.hardware.raise_xid(chip, xid, self.soak.agent.pids):
            self.soak.note(f"XID {xid} on chip {chip} not sent: an agent process running now was sent it already")
            return
        if kind in ("xid-reset", "xid-storm"):
            self.resettable(chip, f"XID {xid}")
        elif kind == "xid-operator":
            self.broken(chip, "return", f"XID {xid}")

    def resettable(self, chip: int, why: str) -> None:
        """A fault a reset clears: healed by a reset, or, where the reset limit leaves the chip to an operator (or may),
        by the return the soak's operator makes RETURN_AFTER_S later."""
        open_by = {by for ch, _, by, _ in self.windows.open if ch == chip}
        outcome = self.counts.fault(chip, self.soak.now(), open_by)
        self.broken(chip, "return" if outcome == limits.LIMITED else outcome, why)
        if outcome != limits.RESET:
            self.soak.note(
                f"chip {chip}: {why} {'after' if outcome == limits.LIMITED else 'maybe after'} the reset limit"
            )
            self.later(limits.RETURN_AFTER_S, lambda: self.limit_return(chip))

    def needs_operator(self, chip: int) -> None:
        """The chip's resets are spent (or the one an operator asked for failed): it waits for the soak's operator."""
        self.windows.to_operator(chip)
        self.soak.note(f"chip {chip} needs an operator: its resets failed")
        self.later(limits.RETURN_AFTER_S, lambda: self.limit_return(chip))

    def limit_return(self, chip: int) -> None:
        """The operator returns a chip left to one (after its cooling, if it is hot); one the limit left certainly must
        have been said in a GPUResetLimitReached Node Event."""
        mine = [by for ch, _, by, _ in self.windows.open if ch == chip]
        if not {"return", "either"} & set(mine):
            return
        if "clear" in mine and not self.ending:
            self.later(5.0, lambda: self.limit_return(chip))
            return
        since = self.counts.chips[chip].limited
        if since is not None:
            said = limit_events(self.soak, self.soak.hardware.uuids[chip], self.soak.start + since - 2)
            what = f"chip {chip} left to an operator by the reset limit at {since:.1f}: no GPUResetLimitReached Event"
            self.soak.invariants["reset limit"].check(said, self.soak.now(), what)
        self.operator_returns(chip)

    def flap(self, chip: int, until: float, flaps: int) -> None:
        """chip-flapping: a new resettable XID on the chip each time it is back in service (healed, and in service),
        until the reset limit leaves it to an operator or `until`."""
        soak = self.soak
        if self.ending:
            return
        if self.counts.chips[chip].limited is not None or soak.now() >= until:
            limited = self.counts.chips[chip].limited is not None
            soak.note(f"chip {chip} flapped {flaps} times: {'left to an operator' if limited else 'time is up'}")
            return
        if not any(w[0] == chip for w in self.windows.open) and self.in_service(chip):
            self.xid(chip, self.unsent(chip), "xid-reset")
            flaps += 1
        self.later(1.0, lambda: self.flap(chip, until, flaps))

    def in_service(self, chip: int) -> bool:
        soak = self.soak
        if soak.mode == "dra":
            return chip in soak.last_up
        return soak.counted_in(soak.in_service_units(), chip)

    def unsent(self, chip: int) -> int:
        """A resettable XID the running agent was not sent for the chip (the backend sends each once a process)."""
        hardware = self.soak.hardware
        done = hardware.sent.union(*hardware.earlier.values())
        return next((x for x in (48, *RESET_XIDS) if (chip, x) not in done), 48)

    def lie_over(self, index: int) -> None:
        chip, since, _ = self.lies[index]
        self.lies[index] = (chip, since, self.soak.now())
        self.soak.hardware.set_lying([chip], False)
        self.soak.note(f"chip {chip}'s resets honest again")

    def judge_lies(self, sample: c.ServiceSample) -> None:
        """Every tick: a chip whose reset lied and that is still broken is not in service (LIE_LAG_S after)."""
        soak, at = self.soak, sample.at
        open_chips = {w[0] for w in self.windows.open}
        out = frozenset(
            chip for chip, lied in self.lied.items() if at >= lied + limits.LIE_LAG_S and chip in open_chips
        )
        if not out or any(begin <= at <= end + limits.LIE_LAG_S for begin, end in soak.quiet):
            return
        ceiling = None if soak.mode == "dra" else soak.units_of(lambda chip: chip not in out)
        limits.not_back_while_lying(soak.invariants["lying reset not trusted"], sample, out, ceiling)

    def judge_limits(self, resets: list[c.Reset], end: float) -> None:
        invariant = self.soak.invariants["reset limit"]
        limits.no_reset_while_limited(invariant, resets, self.counts.limited, end)
        limits.one_reset_per_return(invariant, resets, self.counts.returns, end)

    def later(self, seconds: float, action: Callable[[], None]) -> None:
        self.undo.append((self.soak.now() + seconds, action))

    def undo_due(self, now: float) -> None:
        for due in [u for u in self.undo if u[0] <= now]:
            self.undo.remove(due)
            due[1]()

    def cooled(self, chip: int) -> None:
        self.soak.hardware.set_bit(chip, "OverTemp", False)
        self.soak.note(f"chip {chip} cooled")
        self.close(lambda ch, since, by, why: ch == chip and by == "clear", self.soak.now(), "cooled")

    def back_on_bus(self, chip: int) -> None:
        """A chip's absence ("not present") keeps it out only while it stands (README, "Self-healing GPUs"): back
        on the bus, the agent may put it back at once, so its absence is healed now; the operator returns it too, once
        the agent can see the Node (a return may wait out a quiet window), for what else may wait for one."""
        self.soak.hardware.set_present(chip, True)
        self.soak.note(f"chip {chip} back on the bus")
        self.close(
            lambda ch, since, by, why: ch == chip and by == "return" and why.startswith(OFF_BUS),
            self.soak.now(),
            "back on the bus",
        )
        self.operator_returns(chip)

    def operator_returns(self, chip: int) -> None:
        """The operator's `kubectl annotate node ... iluvatar.com/gpu.return=<uuid>`, removed first: only a chip newly
        named there is a request (README, "The operator's way back"), and the last return may have named this one.
        Not while the agent may not see the Node change (a quiet window: it restarts, or the API server is away):
        the removal and the setting again of one value in that time is not seen (docs/deployment.md), so the
        operator asks once it is over."""
        if any(begin <= self.soak.now() <= end for begin, end in self.soak.quiet):
            if chip not in self.deferred and not self.ending:  # at the end, return_open asks again
                self.deferred.add(chip)
                self.later(RETURN_RETRY_S, lambda: self.deferred_return(chip))
            return
        uuid = self.soak.hardware.uuids[chip]
        self.returned[chip] = self.soak.now()
        certain = self.windows.waits_for_return(chip, present=chip not in self.soak.hardware.absent)
        self.counts.returned(chip, self.soak.now(), certain)
        with contextlib.suppress(KubectlError, AssertionError):
            self.soak.admin("annotate", "node", self.soak.cluster.node_name, f"{RETURN_ANNOTATION}-")
        self.close(
            lambda ch, since, by, why: ch == chip and by == "return" and why.startswith(OFF_BUS),
            self.soak.now(),
            "returned by the operator",
        )
        self.returned_awaits_reset(chip)
        with contextlib.suppress(KubectlError, AssertionError):
            self.soak.admin(
                "annotate", "node", self.soak.cluster.node_name, f"{RETURN_ANNOTATION}={uuid}", "--overwrite"
            )
            self.soak.note(f"operator returned chip {chip}")

    def deferred_return(self, chip: int) -> None:
        self.deferred.discard(chip)
        self.operator_returns(chip)

    def return_open(self) -> None:
        """At the end: return (once more, one at a time) every chip still waiting for an operator, and every chip
        still broken whose reset failed or hung since (a failed reset an operator asked for needs an operator again);
        a chip the agent simply never reset is not returned: the end's check reports it."""
        soak = self.soak
        resets = read_resets(soak.hardware.reset_log, soak.chip_of, soak.start)
        failed = [(chip, r.started) for r in resets if not r.ok for chip in r.chips]
        waiting = sorted(
            {
                chip
                for chip, since, by, _ in self.windows.open
                if by in ("return", "either") or any(c == chip and started >= since for c, started in failed)
            }
        )
        if waiting and self.soak.now() - max(self.returned.values(), default=0) > 10:
            self.operator_returns(waiting[0])

    def restart_agent(self, kill: bool) -> None:
        soak = self.soak
        began = soak.now()
        self.new_agent_process()
        if kill and not soak.agent.kill():
            kill = False
            soak.note("agent's container killed twice already: its pod deleted instead (the kubelet's back-off)")
        elif not kill:
            soak.agent.restart()
        soak.quiet.append((began, soak.now()))
        self.starts.append((began, soak.now()))
        how = "its container killed (SIGKILL), restarted by the kubelet" if kill else "its pod deleted, made again"
        soak.note(f"agent {how}: Ready again (pid {soak.agent.pid})")

    def new_agent_process(self) -> None:
        """Before an agent process starts beside or after this one, the devices file keeps only the XIDs of chips
        still broken (a new process reads the whole file; a broken chip goes on reporting, healed ones don't): the
        resets done since the last look heal theirs first (a step that held the soak up let them wait)."""
        self.soak.observe_resets()
        self.soak.hardware.agent_restarted(self.windows.still_broken_xids(), self.soak.agent.pids)

    def roll(self, kind: str) -> None:
        """`helm upgrade` (a pod annotation changed) or `helm rollback`: the DaemonSet rolls its pods as the chart's
        updateStrategy says, while the soak goes on; "kept in a rollout" judges what stayed in service."""
        soak, agent = self.soak, self.soak.agent
        self.new_agent_process()
        soak.settled_since = None
        before: frozenset[int] | int = soak.last_up if soak.mode == "dra" else soak.in_service_units()
        began = soak.now()
        if kind == "rollout":
            agent.rollout()
        else:
            if len(agent.revisions) < 2:
                agent.rollout()
                soak.note("nothing to roll back to: rolled out first")
            index = agent.rollback()
            if index != soak.config_at(soak.now()):
                soak.configs.append((soak.now(), index))
                soak.quiet.append((began, soak.now() + 5))
        soak.rollouts.append(c.Rollout(began, before, f"{kind} to revision {len(agent.revisions)}"))
        soak.note(f"{kind}: revision {len(agent.revisions)}, rollout {agent.rollouts} (in service before: {before})")

    def switch(self, to: str) -> None:
        """The node switched to mode `to` (or back to the soak's). While the other mode acts, the soak's own is out
        of service: "back in service" and "kept in a rollout" do not judge it (a quiet window, from the switch until
        5 s after the soak's mode is back), the rest goes on (its running containers keep their chips: no reset
        under them, whichever pod acts); while it is away (`away`, until its pod is Ready again), DRA, the slices
        the kubelet keeps are no agent's (checker.given_by_prepare)."""
        soak = self.soak
        began = soak.now()
        self.new_agent_process()
        soak.settled_since = None
        soak.agent.switch(to)
        if to != soak.mode:
            self.switched = (began, len(soak.quiet))
            soak.quiet.append((began, float("inf")))
            soak.away.append((began, float("inf")))
        elif self.switched is not None:
            since, index = self.switched
            soak.quiet[index] = (since, soak.now() + 5)
            soak.away[-1] = (since, soak.now())
            self.switched = None
        self.starts.append((began, soak.now()))
        soak.note(f"node switched to {to}: its pod Ready ({soak.now() - began:.1f} s, pid {soak.agent.pid})")

    def unreadable(self, kind: str) -> None:
        plugins = self.soak.cluster.plugins_dir
        pattern = f"**/{NODE_RECORD}" if kind == "node-health-unreadable" else "gpu.iluvatar.com/**/checkpoint*.json"
        targets = [p for p in plugins.glob(pattern) if p.is_file()]
        for path in targets:
            path.write_bytes(UNREADABLE)
        self.soak.note(f"made unreadable: {', '.join(map(str, targets)) or 'nothing there yet'}")
        if kind == "node-health-unreadable":
            self.forget_all("the node-health record made unreadable")
        self.restart_agent(kill=True)

    def heal_all(self) -> None:
        """The end of the soak: the hardware as good as new, ixsmi working, every chip that needs it returned."""
        hardware = self.soak.hardware
        self.ending = True
        for _, action in sorted(self.undo, key=lambda u: u[0]):
            action()
        self.undo.clear()
        hardware.set_ixsmi("ok")
        for chip in range(len(hardware.chips)):
            if "OverTemp" in hardware.bits.get(chip, ()):
                self.cooled(chip)
            if chip in hardware.absent:
                self.back_on_bus(chip)


LIMIT_REASON = "GPUResetLimitReached"


def limit_events(soak: SoakRun, uuid: str, since: float) -> bool:
    """Whether a GPUResetLimitReached Event on the Node names the chip, said at `since` (Unix time) or later."""
    try:
        events = soak.api.items(f"/api/v1/events?fieldSelector=reason%3D{LIMIT_REASON}")
    except OSError:
        return False
    for event in events:
        said = event.get("lastTimestamp") or event.get("eventTime") or ""
        when = datetime.fromisoformat(said.replace("Z", "+00:00")).timestamp() if said else 0.0
        node = (event.get("involvedObject") or {}).get("kind") == "Node"
        if node and uuid in event.get("message", "") and when >= since:
            return True
    return False
