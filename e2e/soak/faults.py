"""How each fault of the schedule is caused on the node and undone when its time is up: the chips' faults on the
simulated hardware, ixsmi's, and the agent's life (restarts, config changes, rollouts, mode switches). What each
fault broke, and what heals it, the model of healing (healing.py) keeps."""

from __future__ import annotations

from collections.abc import Callable

from harness.cluster import Cluster

from . import checker as c
from .agent import NAMESPACE as AGENT_NAMESPACE
from .agent import Agent, container_id
from .hardware import Hardware
from .healing import Healing
from .later import Later
from .returns import RETURN_ANNOTATION as RETURN_ANNOTATION  # the scenarios' clean node removes it
from .returns import Returns
from .schedule import DEVICE_PLUGIN_CONFIGS, FLAPPING, LIE_WAIT_S, LYING, MODE_SWITCH, Step
from .timeline import Timeline
from .view import ModeView
from .windows import OFF_BUS

NODE_DIR, NODE_RECORD = "iluvatar.com", "node-health.json"  # in the kubelet's plugins directory (README)
UNREADABLE = b"\x00{not json \xff"
CONFIG_QUIET_S = 5.0  # after a config change is in force, everything may take this long to come back
XID_KINDS = ("xid-reset", "xid-ignored", "xid-operator", "xid-storm")
IXSMI_KINDS = {"ixsmi-failing": "fail", "ixsmi-hanging": "hang", "ixsmi-slow": "slow {seconds}"}


class FaultActions:
    def __init__(
        self,
        timeline: Timeline,
        hardware: Hardware,
        agent: Agent,
        cluster: Cluster,
        view: ModeView,
        later: Later,
        healing: Healing,
        returns: Returns,
    ) -> None:
        self.timeline, self.hardware, self.agent, self.cluster, self.view = timeline, hardware, agent, cluster, view
        self.later, self.healing, self.returns = later, healing, returns
        self.switched: tuple[float, int] | None = None  # while the other mode acts: (since, its quiet window's index)
        self.causes: dict[str, Callable[[Step], None]] = {
            **{kind: self.xids for kind in XID_KINDS},
            **{kind: self.ixsmi for kind in IXSMI_KINDS},
            "health-reset-bit": self.reset_bit,
            FLAPPING: lambda step: self.flap(step.chips[0], self.timeline.now() + step.duration, 0),
            LYING: self.lying,
            "health-overtemp": self.overtemp,
            "off-bus": self.off_bus,
            "agent-kill": lambda step: self.restart_agent(kill=True),
            "agent-restart": lambda step: self.restart_agent(kill=False),
            "kubelet-restart": self.kubelet_restart,
            "config-change": self.config_change,
            "rollout": lambda step: self.roll(step.kind),
            "rollback": lambda step: self.roll(step.kind),
            "node-health-unreadable": lambda step: self.unreadable(step.kind),
            "checkpoint-unreadable": lambda step: self.unreadable(step.kind),
            MODE_SWITCH: self.mode_switch,
        }

    def do(self, step: Step) -> None:
        """Cause the fault; where the agent reads its config only at start, a fault that set another config (a
        `helm rollback` brings its revision's back) has it in force once the agent's pod is restarted."""
        if step.kind not in self.causes:
            raise AssertionError(f"no way to cause {step.kind}")
        if step.kind == "config-change" and self.view.restarts_for_config:
            self.change_config_restarting(int(str(step.detail["config"])))
            return
        configs, began = len(self.timeline.configs), self.timeline.now()
        self.causes[step.kind](step)
        if self.view.restarts_for_config and len(self.timeline.configs) > configs:
            self.restart_for_config(began)

    # ------------------------------------------------------------------ the chips

    def xids(self, step: Step) -> None:
        xids = list(step.detail.get("xids") or [step.detail["xid"]])  # type: ignore[arg-type]
        chips = step.chips
        for index, chip in enumerate(chips):
            self.xid(chip, int(xids[index % len(xids)]), step.kind)
        if step.kind == "xid-operator":
            self.later.after(step.duration, lambda: self.returns.operator_returns(chips[0]))

    def xid(self, chip: int, xid: int, kind: str) -> None:
        if not self.hardware.raise_xid(chip, xid, self.agent.pids):
            self.timeline.note(f"XID {xid} on chip {chip} not sent: an agent process running now was sent it already")
            return
        if kind in ("xid-reset", "xid-storm"):
            self.healing.resettable(chip, f"XID {xid}")
        elif kind == "xid-operator":
            self.healing.broken(chip, "return", f"XID {xid}")

    def reset_bit(self, step: Step) -> None:
        self.hardware.set_bit(step.chips[0], str(step.detail["bit"]), True)
        self.healing.resettable(step.chips[0], f"health {step.detail['bit']}")

    def flap(self, chip: int, until: float, flaps: int) -> None:
        """chip-flapping: a new resettable XID on the chip each time it is back in service (healed, and in service),
        until the reset limit leaves it to an operator or `until`."""
        if self.later.ending:
            return
        if self.healing.limited(chip) or self.timeline.now() >= until:
            limited = self.healing.limited(chip)
            self.timeline.note(
                f"chip {chip} flapped {flaps} times: {'left to an operator' if limited else 'time is up'}"
            )
            return
        if not self.healing.is_open(chip) and self.view.in_service(chip):
            self.xid(chip, self.healing.unsent(chip), "xid-reset")
            flaps += 1
        self.later.after(1.0, lambda: self.flap(chip, until, flaps))

    def lying(self, step: Step) -> None:
        chip = step.chips[0]
        self.hardware.set_lying(step.chips, True)
        index = self.healing.lie_begins(chip)
        self.xid(chip, self.healing.unsent(chip), "xid-reset")
        latest = self.timeline.now() + step.duration + LIE_WAIT_S
        self.later.after(step.duration, lambda: self.lie_ends(index, latest))

    def lie_ends(self, index: int, latest: float) -> None:
        """The lie is over once a reset of its chip lied in it (the agent's first attempt; a container holding the
        chip or the reset limit may put that off), or at `latest`, or at the soak's end."""
        if self.healing.lie_caught(index) or self.timeline.now() >= latest or self.later.ending:
            self.healing.lie_over(index)
        else:
            self.later.after(1.0, lambda: self.lie_ends(index, latest))

    def overtemp(self, step: Step) -> None:
        chip = step.chips[0]
        self.hardware.set_bit(chip, "OverTemp", True)
        self.healing.broken(chip, "clear", "health OverTemp")
        self.later.after(step.duration, lambda: self.cooled(chip))

    def cooled(self, chip: int) -> None:
        self.hardware.set_bit(chip, "OverTemp", False)
        self.timeline.note(f"chip {chip} cooled")
        self.healing.cleared(chip, "cooled")

    def off_bus(self, step: Step) -> None:
        chip = step.chips[0]
        self.hardware.set_present(chip, False)
        self.healing.broken(chip, "return", OFF_BUS)
        self.later.after(step.duration, lambda: self.back_on_bus(chip))

    def back_on_bus(self, chip: int) -> None:
        """A chip's absence ("not present") keeps it out only while it stands (README, "Self-healing GPUs"): back
        on the bus, the agent may put it back at once, so its absence is healed now; the operator returns it too, once
        the agent can see the Node (a return may wait out a quiet window), for what else may wait for one."""
        self.hardware.set_present(chip, True)
        self.timeline.note(f"chip {chip} back on the bus")
        self.healing.back_on_bus(chip, OFF_BUS)
        self.returns.operator_returns(chip)

    def ixsmi(self, step: Step) -> None:
        self.hardware.set_ixsmi(IXSMI_KINDS[step.kind].format(seconds=step.detail.get("seconds")))
        self.later.after(step.duration, lambda: self.hardware.set_ixsmi("ok"))

    # ------------------------------------------------------------------ the agent's life

    def new_agent_process(self) -> None:
        """Before an agent process starts beside or after this one, the devices file keeps only the XIDs of chips
        still broken (a new process reads the whole file; a broken chip goes on reporting, healed ones don't)."""
        self.hardware.agent_restarted(self.healing.still_broken_xids(), self.agent.pids)

    def restart_agent(self, kill: bool) -> None:
        timeline, agent = self.timeline, self.agent
        began = timeline.now()
        self.new_agent_process()
        if kill:
            how = agent.kill()
        else:
            agent.restart()
            how = "its pod deleted, made again"
        timeline.quiet.append((began, timeline.now()))
        timeline.starts.append((began, timeline.now()))
        timeline.note(f"agent {how}: Ready again (pid {agent.pid})")

    def kubelet_restart(self, step: Step) -> None:
        began = self.timeline.now()
        self.cluster.stop_kubelet()
        self.cluster.start_kubelet()
        self.timeline.quiet.append((began, self.timeline.now() + 10))

    def config_change(self, step: Step) -> None:
        timeline = self.timeline
        began, index = timeline.now(), int(str(step.detail["config"]))
        self.agent.set_config(index)  # returns once the pod's mounted ConfigMap says it
        timeline.configs.append((timeline.now(), index))
        timeline.quiet.append((began, timeline.now() + CONFIG_QUIET_S))

    def change_config_restarting(self, index: int) -> None:
        """The operator's live change: `helm upgrade` of `config.content` (and the pod annotation, so that the
        revision's pods are its config's), then the agent's pod restarted to read it; a DaemonSet's rolling update
        is not waited for."""
        began = self.timeline.now()  # the upgrade's rolling update may start an agent with the new config at once
        self.agent.config_index = index
        self.agent.rollout()
        self.restart_for_config(began)

    def restart_for_config(self, began: float) -> None:
        timeline, agent = self.timeline, self.agent
        self.new_agent_process()
        pod = agent.newest()
        self.cluster.admin.delete("pod", pod["metadata"]["name"], AGENT_NAMESPACE, wait=False)
        agent.starts += 1
        agent.wait_settled(other_than=container_id(pod))
        index = agent.config_index
        timeline.configs.append((timeline.now(), index))
        timeline.config_changes.append((began, timeline.now()))
        timeline.quiet.append((began, timeline.now() + CONFIG_QUIET_S))
        timeline.note(
            f"config {index} in force: {DEVICE_PLUGIN_CONFIGS[index]} (pod restarted, {timeline.now() - began:.1f} s)"
        )

    def roll(self, kind: str) -> None:
        """`helm upgrade` (a pod annotation changed) or `helm rollback`: the DaemonSet rolls its pods as the chart's
        updateStrategy says, while the soak goes on; "kept in a rollout" judges what stayed in service."""
        timeline, agent = self.timeline, self.agent
        self.new_agent_process()
        timeline.unsettled()
        before = self.view.before_rollout()
        began = timeline.now()
        if kind == "rollout":
            agent.rollout()
        else:
            if len(agent.revisions) < 2:
                agent.rollout()
                timeline.note("nothing to roll back to: rolled out first")
            index = agent.rollback()
            if index != timeline.config_at(timeline.now()):
                timeline.configs.append((timeline.now(), index))
                timeline.quiet.append((began, timeline.now() + CONFIG_QUIET_S))
        timeline.rollouts.append(c.Rollout(began, before, f"{kind} to revision {len(agent.revisions)}"))
        timeline.note(
            f"{kind}: revision {len(agent.revisions)}, rollout {agent.rollouts} (in service before: {before})"
        )

    def mode_switch(self, step: Step) -> None:
        self.switch(str(step.detail["to"]))
        self.later.after(step.duration, lambda: self.switch(self.view.mode))

    def switch(self, to: str) -> None:
        """The node switched to mode `to` (or back to the soak's). While the other mode acts, the soak's own is out
        of service: "back in service" and "kept in a rollout" do not judge it (a quiet window, from the switch until
        5 s after the soak's mode is back), the rest goes on (its running containers keep their chips: no reset
        under them, whichever pod acts); while it is away (`away`, until its pod is Ready again), DRA, the slices
        the kubelet keeps are no agent's (checker.given_by_prepare)."""
        timeline = self.timeline
        began = timeline.now()
        self.new_agent_process()
        timeline.unsettled()
        self.agent.switch(to)
        if to != self.view.mode and self.switched is not None:
            # still away (a switch that took longer than the schedule allows for): the time away began earlier
            timeline.note(f"node switched to {to} again while away since {self.switched[0]:.1f}")
        elif to != self.view.mode:
            self.switched = (began, len(timeline.quiet))
            timeline.quiet.append((began, float("inf")))
            timeline.away.append((began, float("inf")))
        elif self.switched is not None:
            since, index = self.switched
            timeline.quiet[index] = (since, timeline.now() + 5)
            timeline.away[-1] = (since, timeline.now())
            self.switched = None
        timeline.starts.append((began, timeline.now()))
        timeline.note(f"node switched to {to}: its pod Ready ({timeline.now() - began:.1f} s, pid {self.agent.pid})")

    def unreadable(self, kind: str) -> None:
        plugins = self.cluster.plugins_dir
        pattern = f"**/{NODE_RECORD}" if kind == "node-health-unreadable" else "gpu.iluvatar.com/**/checkpoint*.json"
        targets = [p for p in plugins.glob(pattern) if p.is_file()]
        for path in targets:
            path.write_bytes(UNREADABLE)
        self.timeline.note(f"made unreadable: {', '.join(map(str, targets)) or 'nothing there yet'}")
        if kind == "node-health-unreadable":
            self.healing.forget_all("the node-health record made unreadable")
        self.restart_agent(kill=True)

    # ------------------------------------------------------------------ the end

    def heal_all(self) -> None:
        """The end of the soak: the hardware as good as new, ixsmi working, every chip that needs it returned."""
        hardware = self.hardware
        self.later.finish()
        hardware.set_ixsmi("ok")
        for chip in range(len(hardware.chips)):
            if "OverTemp" in hardware.bits.get(chip, ()):
                self.cooled(chip)
            if chip in hardware.absent:
                self.back_on_bus(chip)
