"""How each kind of fault of the schedule is caused on the node, undone when its time is up, and when the chips it
broke count as healed (the windows the checker's "broken not given" and "back in service" judge by)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from harness.kube import KubectlError

from . import checker as c
from .observe import read_resets
from .run import SoakRun
from .schedule import MODE_SWITCH, Step
from .windows import Windows

RETURN_ANNOTATION = "iluvatar.com/gpu.return"
NODE_DIR, NODE_RECORD = "iluvatar.com", "node-health.json"  # in the kubelet's plugins directory (README)
UNREADABLE = b"\x00{not json \xff"


class FaultActions:
    def __init__(self, soak: SoakRun) -> None:
        self.soak = soak
        self.undo: list[tuple[float, Callable[[], None]]] = []
        self.created: list[str] = []
        self.windows = Windows(soak.broken)  # what is broken and what heals it
        self.returned: dict[int, float] = {}  # chip -> when an operator returned it
        self.switched: tuple[float, int] | None = None  # while the other mode acts: (since, its quiet window's index)

    # ------------------------------------------------------------------ windows

    def broken(self, chip: int, heals_by: str, why: str) -> None:
        self.windows.add(chip, self.soak.now(), heals_by, why)

    def close(self, match: Callable[[int, float, str, str], bool], at: float, how: str) -> None:
        self.windows.close(match, at, how)

    def healed_by_reset(self, reset: c.Reset) -> None:
        """A reset that succeeded heals what a reset heals on the simulated chips, and returns what an operator
        returned before it."""
        assert reset.ended is not None
        ended = reset.ended
        for chip in reset.chips:  # seen late (a step held the soak up): a bit set after the reset ended stays
            later = self.windows.opened_since(chip, ended)
            for bit in list(self.soak.hardware.bits.get(chip, ())):
                if bit != "OverTemp" and f"health {bit}" not in later:
                    self.soak.hardware.set_bit(chip, bit, False)

        def heals(chip: int, since: float, by: str, why: str) -> bool:
            return chip in reset.chips and since < ended and by == "reset"

        self.close(heals, ended, f"healed by the reset ending at {ended:.1f}")

    def returned_awaits_reset(self, chip: int) -> None:
        """A return is no cure for an XID: the agent resets the chip once more and only a reset that succeeds brings
        it back (README, "The operator's way back"); one that fails or hangs leaves it needing an operator again. (A
        chip back on the bus is closed at its return above: its absence was a health condition, not an XID.)"""
        self.windows.awaits_reset(chip, self.soak.now())

    def forget_all(self, why: str) -> None:
        """The agent's memory of broken chips made unreadable: what only it knew (an XID) it may have forgotten
        (windows.py); what the hardware still says (bits, absence) it has not."""
        self.windows.forget_xids(self.soak.now(), why)

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
            self.broken(chips[0], "reset", f"health {step.detail['bit']}")
        elif kind == "health-overtemp":
            hardware.set_bit(chips[0], "OverTemp", True)
            self.broken(chips[0], "clear", "health OverTemp")
            self.later(step.duration, lambda: self.cooled(chips[0]))
        elif kind == "off-bus":
            hardware.set_present(chips[0], False)
            self.broken(chips[0], "return", "fell off the bus")
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
            self.broken(chip, "reset", f"XID {xid}")
        elif kind == "xid-operator":
            self.broken(chip, "return", f"XID {xid}")

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
        self.soak.hardware.set_present(chip, True)
        self.soak.note(f"chip {chip} back on the bus")
        self.operator_returns(chip)

    def operator_returns(self, chip: int) -> None:
        """The operator's `kubectl annotate node ... iluvatar.com/gpu.return=<uuid>`, removed first: only a chip newly
        named there is a request (README, "The operator's way back"), and the last return may have named this one."""
        uuid = self.soak.hardware.uuids[chip]
        self.returned[chip] = self.soak.now()
        with contextlib.suppress(KubectlError, AssertionError):
            self.soak.admin("annotate", "node", self.soak.cluster.node_name, f"{RETURN_ANNOTATION}-")
        self.close(
            lambda ch, since, by, why: ch == chip and by == "return" and not why.startswith("XID"),
            self.soak.now(),
            "returned by the operator",
        )
        self.returned_awaits_reset(chip)
        with contextlib.suppress(KubectlError, AssertionError):
            self.soak.admin(
                "annotate", "node", self.soak.cluster.node_name, f"{RETURN_ANNOTATION}={uuid}", "--overwrite"
            )
            self.soak.note(f"operator returned chip {chip}")

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
                if by == "return" or any(c == chip and started >= since for c, started in failed)
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
        for _, action in sorted(self.undo, key=lambda u: u[0]):
            action()
        self.undo.clear()
        hardware.set_ixsmi("ok")
        for chip in range(len(hardware.chips)):
            if "OverTemp" in hardware.bits.get(chip, ()):
                self.cooled(chip)
            if chip in hardware.absent:
                self.back_on_bus(chip)
