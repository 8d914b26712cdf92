"""The soak: composes its parts once for the mode, then carries out a schedule (schedule.py) on the e2e cluster
against the agent, looks at the node every second (observer.py) and judges the invariants afterwards (judge.py)."""

from __future__ import annotations

import contextlib
import time

from harness.cluster import Cluster
from harness.kube import KubectlError

from . import checker as c
from . import draconfig
from .agent import Agent
from .apifaults import KINDS as API_FAULTS
from .apifaults import ApiFaults
from .cost import Cost
from .dpview import DevicePluginView
from .draview import DraView
from .faults import FaultActions
from .hardware import Hardware
from .healing import Healing
from .judge import Judge
from .later import Later
from .limits import ResetCounts
from .observe import Api
from .observer import Observer
from .returns import Returns
from .schedule import CHIPS, Step
from .timeline import Timeline
from .view import ModeView
from .windows import Windows

TICK_S = 1.0
# What a fault does later (a flapping chip's next XID, a return waiting for a quiet window to end) is over this long
# after the schedule's last step; one still waiting then is the soak's own defect, not the agent's.
LATER_LIMIT_S = 300.0
SETTLE_S = c.BOUND_S + 30
INVARIANTS = (
    "devices match",
    "no reset under a holder",
    "broken not given",
    "back in service",
    "bounded",
    "kept in a rollout",
    "API requests per minute",
    "no admission refused by the agent",
    "reset limit",
    "lying reset not trusted",
    "nothing left",
)
VIEWS: dict[str, type[ModeView]] = {"device-plugin": DevicePluginView, "dra": DraView}


class SoakOverran(RuntimeError):
    """The soak's own later actions never ended: reported, not waited for."""


class Soak:
    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        mode: str,
        seed: int,
        steps: list[Step],
        agent: Agent,
        hardware: Hardware,
        settle_s: float = SETTLE_S + 60,  # at the end, how long everything may take to heal and come back
    ) -> None:
        self.cluster, self.namespace, self.mode, self.seed, self.steps = cluster, namespace, mode, seed, steps
        self.agent, self.hardware, self.settle_s = agent, hardware, settle_s
        self.admin = cluster.admin
        self.invariants = {name: c.Invariant(name) for name in INVARIANTS}
        self.timeline = Timeline()
        self.cost = Cost()  # what the run costs the machine, for the report
        timeline, invariants = self.timeline, self.invariants
        api = Api(cluster.server, cluster.admin_tls())
        windows = Windows(timeline.broken)  # what is broken and what heals it
        self.later = Later(timeline.now)
        counts = ResetCounts(CHIPS)  # the reset limit and attempts, as far as the soak knows them
        self.view = VIEWS[mode](cluster, api, namespace, agent, hardware, timeline, windows)
        self.returns = Returns(timeline, hardware, windows, counts, self.later, cluster, api, invariants)
        self.healing = healing = Healing(
            timeline, hardware, windows, counts, self.later, self.returns, self.view, invariants
        )
        self.faults = FaultActions(timeline, hardware, agent, cluster, self.view, self.later, healing, self.returns)
        self.api_faults = ApiFaults(cluster, timeline, self.later, self.view.state_directories)
        self.observer = Observer(
            api, self.admin, namespace, agent, hardware, timeline, self.view, windows, healing, invariants, self.cost
        )
        self.judge = Judge(cluster, agent, hardware, timeline, self.view, healing, invariants)
        self.created: list[str] = []  # workloads created and not deleted yet

    @property
    def held(self) -> dict[str, frozenset[int]]:
        """Pod -> the chips it held at the last look."""
        return self.observer.held

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        self.timeline.begin()
        self.cost.start()
        self.api_faults.disk.mount()
        try:
            self.run_mounted()
        finally:
            self.api_faults.heal_all()
            self.api_faults.disk.release()

    def run_mounted(self) -> None:
        timeline = self.timeline
        self.view.prepare()
        first = draconfig.first_config(self.seed, self.mode)
        timeline.configs = [(0.0, first)]
        self.agent.set_config(first)
        self.agent.start()
        timeline.begin()  # the schedule's times count from the agent's pod Ready (helm install: seconds)
        timeline.quiet.append((0.0, timeline.now()))
        timeline.note(f"agent started (pid {self.agent.pid})")
        self.carry_out(list(self.steps))
        self.wind_down()

    def carry_out(self, pending: list[Step]) -> None:
        """Each step when it is due, with what the faults do later, looking at the node each tick, until both are
        done; what is still waiting LATER_LIMIT_S after the last step is the soak's own defect (SoakOverran)."""
        timeline = self.timeline
        ends_by = (pending[-1].at if pending else 0.0) + LATER_LIMIT_S
        while pending or self.later.pending:
            due = timeline.now()
            if due > ends_by:
                raise SoakOverran(f"what the faults do later still waited at t+{due:.0f} s: {self.later.describe()}")
            while pending and pending[0].at <= due:
                self.later.run_due(pending[0].at)  # a fault over before this step (one that waits holds both up)
                self.do(pending.pop(0))
            self.later.run_due(due)
            self.observer.tick()
            time.sleep(max(0.0, TICK_S - (timeline.now() - due)))

    def do(self, step: Step) -> None:
        detail = step.detail
        self.timeline.note(
            step.what() if step.is_fault else f"{step.kind} {detail.get('pod')} {detail.get('shape', '')}"
        )
        if step.kind == "pod-create":
            self.create_pod(str(detail["pod"]), str(detail["shape"]))
        elif step.kind == "pod-delete":
            self.delete_pod(str(detail["pod"]))
        else:
            self.timeline.faults_done.append(step)
            (self.api_faults if step.kind in API_FAULTS else self.faults).do(step)

    def wind_down(self) -> None:
        """Faults over: everything healed, returned and deleted; then every chip must come back within the bound
        and nothing may be left behind."""
        timeline = self.timeline
        timeline.note("soak over: healing everything, deleting the workload")
        self.faults.heal_all()
        self.api_faults.heal_all()
        for pod in list(self.held) + self.created:
            self.delete_pod(pod)
        deadline = timeline.now() + self.settle_s
        while timeline.now() < deadline:
            self.observer.tick()
            if self.settled():
                break
            self.returns.return_open(self.healing.untrusted)
            time.sleep(TICK_S)
        self.judge.all_back(self.settle_s)
        self.judge.afterwards()

    def settled(self) -> bool:
        timeline = self.timeline
        open_windows = [w for w in timeline.broken if w.until is None]
        full = timeline.in_service_units() == self.view.full_units()
        return not open_windows and not self.held and full and timeline.now() - timeline.quiet_end() > c.BOUND_S

    # ------------------------------------------------------------------ workload

    def create_pod(self, name: str, shape: str) -> None:
        try:
            self.view.create(name, shape)
            self.created.append(name)
            self.timeline.pods_created += 1
        except (KubectlError, AssertionError) as error:
            self.timeline.note(f"pod {name} not created: {str(error)[:200]}")

    def delete_pod(self, name: str) -> None:
        try:
            gone = ("--ignore-not-found", "--wait=false", "-n", self.namespace)
            pods = self.view.pods_of(name)
            self.timeline.deleted.update(pods)
            self.admin("delete", "pod", *pods, *gone)
            if claims := self.view.claims_of(name):
                self.admin("delete", "resourceclaim", *claims, *gone)
        except (KubectlError, AssertionError) as error:
            self.timeline.note(f"pod {name} not deleted: {str(error)[:200]}")
        if name in self.created:
            self.created.remove(name)


def stop(soak: Soak) -> None:
    """The agent uninstalled, after the workload is gone where the soak did not get to its end (a DRA claim's pod
    is only removed once the driver has unprepared it)."""
    if soak.agent.installed:
        with contextlib.suppress(KubectlError, AssertionError):
            soak.admin("delete", "pods", "--all", "-n", soak.namespace, "--wait=true", "--timeout=90s", timeout=120)
    soak.agent.stop()
