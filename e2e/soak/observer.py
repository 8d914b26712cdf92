"""The soak's look at the node every second, from outside the agent: what the workload holds and its containers
show, the resets the agent made, what is in service, the agent's resources and its rollouts; each judged as seen."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.kube import Kubectl, KubectlError
from harness.plugin import CONTROL_MINOR, DEVICE_MAJOR

from . import checker as c
from .agent import NAMESPACE as AGENT_NAMESPACE
from .agent import Agent, container_id
from .cost import Cost
from .hardware import Hardware
from .healing import Healing
from .observe import SHOW, Api, certainly_running, process_usage, shown
from .timeline import Timeline
from .view import Allocated, ModeView, Pod
from .windows import Windows


class Observer:
    def __init__(
        self,
        api: Api,
        admin: Kubectl,
        namespace: str,
        agent: Agent,
        hardware: Hardware,
        timeline: Timeline,
        view: ModeView,
        windows: Windows,
        healing: Healing,
        invariants: Mapping[str, c.Invariant],
        cost: Cost,
    ) -> None:
        self.api, self.admin, self.namespace, self.agent, self.hardware = api, admin, namespace, agent, hardware
        self.timeline, self.view, self.windows, self.healing, self.invariants = (
            timeline,
            view,
            windows,
            healing,
            invariants,
        )
        self.cost = cost
        self.held: dict[str, frozenset[int]] = {}  # pod -> chips last seen allocated
        self.verified: dict[str, frozenset[int]] = {}  # pod -> chips its container showed, matching its allocation
        self.last_tick = 0.0
        self.last_service: object = None

    def tick(self) -> None:
        at = self.timeline.now()
        self.cost.sample()
        try:
            pods = self.api.items(f"/api/v1/namespaces/{self.namespace}/pods")
            allocated = self.view.allocated(pods)
            self.view.read_events(at)
        except OSError as error:  # the API server restarting: next tick
            self.timeline.note(f"API not readable: {error}")
            return
        self.holdings(at, pods, allocated)
        self.healing.catch_up()
        self.service(at)
        for pid in self.agent.pids:
            usage = process_usage(pid)
            if usage is not None:
                c.bounded(self.invariants["bounded"], at, *usage)
        self.rollouts(at)
        self.last_tick = at

    def holdings(self, at: float, pods: list[Pod], allocated: Allocated) -> None:
        timeline, holdings = self.timeline, []
        for pod in pods:
            name = pod["metadata"]["name"]
            self.failed(at, name, pod.get("status") or {})
            if name not in allocated:
                continue
            chips = allocated[name][1]
            if name not in self.held:
                timeline.allocations.append(c.NewAllocation(name, chips, self.last_tick, at))
                timeline.note(f"{name} allocated chips {sorted(chips)}")
            if certainly_running(pod):
                timeline.running.setdefault(name, at)
                if name not in self.verified:
                    self.verify(at, name, chips)
                holdings.append(c.Holding(name, self.verified.get(name, chips)))
        for gone in set(self.held) - set(allocated):
            timeline.note(f"{gone} no longer holds chips {sorted(self.held[gone])}")
            self.verified.pop(gone, None)
        self.held = {name: chips for name, (_, chips) in allocated.items()}
        timeline.samples.append(c.HoldSample(at, tuple(holdings)))

    def failed(self, at: float, name: str, status: dict[str, Any]) -> None:
        timeline = self.timeline
        if status.get("phase") == "Failed" and name not in timeline.failed:
            timeline.failed[name] = f"{status.get('reason', '')}: {status.get('message', '')}"[:300]
            if name not in timeline.deleted:  # a pod deleted before it ran is failed too, with no reason
                timeline.failures.append(c.Failure(at, name, status.get("reason", ""), status.get("message", "")))
            timeline.note(f"{name} failed: {timeline.failed[name]}")

    def verify(self, at: float, name: str, chips: frozenset[int]) -> None:
        """Exec into the container: its device nodes and CoreX variables against its allocation."""
        try:
            output = self.admin("exec", name, "-n", self.namespace, "-c", "main", "--", "sh", "-c", SHOW, timeout=30)
        except (KubectlError, AssertionError) as error:
            self.timeline.note(f"exec into {name} failed (checked at its next tick): {str(error)[:160]}")
            return
        nodes, env = shown(output)
        seen = c.Seen(at, name, nodes, env, self.view.expected_sets(name, chips), self.view.given_to(name))
        invariant = self.invariants["devices match"]
        before = len(invariant.violations)
        c.devices_match(invariant, seen, self.hardware.uuids, DEVICE_MAJOR, CONTROL_MINOR)
        if len(invariant.violations) == before:
            self.view.verified(invariant, at, name, env)
        if len(invariant.violations) == before:
            chip_of = self.hardware.chip_of
            self.verified[name] = frozenset(chip_of[u] for u in env.get("IX_VISIBLE_DEVICES", "").split(","))

    def service(self, at: float) -> None:
        sample, units = self.view.read_service(at)
        self.windows.seen_back(at, self.view.in_service, self.timeline.away)
        self.view.judge_service(self.invariants["back in service"], sample)
        for rollout in self.timeline.rollouts:
            self.view.judge_rollout(self.invariants["kept in a rollout"], rollout, sample)
        self.healing.judge_lies(sample)
        if units != self.last_service:
            self.timeline.note(f"in service: {units}")
            self.last_service = units
        self.timeline.service.append((at, units))

    def rollouts(self, at: float) -> None:
        """A rollout is done once the DaemonSet has had only its one up-to-date pod, available, for
        ROLLOUT_SETTLED_S (read every tick while one is under way)."""
        timeline = self.timeline
        under_way = [rollout for rollout in timeline.rollouts if rollout.done is None]
        if not under_way:
            return
        app = self.agent.app
        try:
            daemonset = self.api.get(f"/apis/apps/v1/namespaces/{AGENT_NAMESPACE}/daemonsets/{app}")
            pods = self.api.items(
                f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods?labelSelector=app.kubernetes.io/name%3D{app}"
            )
        except OSError:
            return
        self.agent.follow_logs([pod for pod in pods if container_id(pod)])
        if not self.agent.settled(daemonset, pods):
            timeline.unsettled()
            return
        # Settled a while: a `helm rollback` right after an upgrade reads settled before the DaemonSet starts over.
        timeline.settled_since = timeline.settled_since or at
        if at - timeline.settled_since >= c.ROLLOUT_SETTLED_S:
            for rollout in under_way:
                rollout.done = timeline.settled_since
                timeline.note(f"{rollout.what} done ({rollout.done - rollout.began:.1f} s)")
