"""The soak: carries out a schedule (schedule.py) on the e2e cluster against the agent, observes the node every
second from outside, and judges the invariants (checker.py) as it goes and at the end."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cluster import Cluster
from harness.dra import DRIVER
from harness.kube import Kubectl, KubectlError
from harness.plugin import CONTROL_MINOR, DEVICE_MAJOR
from harness.pods import STAY, busybox_pod

from . import checker as c
from . import draconfig, workload
from .agent import NAMESPACE as AGENT_NAMESPACE
from .agent import Agent, container_id
from .apifaults import KINDS as API_FAULTS
from .apifaults import ApiFaults
from .cost import Cost
from .drawatch import DraWatch
from .faults import FaultActions
from .hardware import Hardware
from .load import agent_requests
from .observe import (
    SHOW,
    Api,
    certainly_running,
    checkpoint_devices,
    claim_devices,
    leftovers,
    process_usage,
    read_resets,
    shown,
)
from .schedule import CHIPS, DEVICE_PLUGIN_CONFIGS, Step

TICK_S = 1.0
RESOURCE = "iluvatar.com/gpu"
SETTLE_S = c.BOUND_S + 30


@dataclass
class Soak:
    cluster: Cluster
    namespace: str
    mode: str
    seed: int
    steps: list[Step]
    agent: Agent
    hardware: Hardware
    start: float = 0.0
    events: list[tuple[float, str]] = field(default_factory=list)
    broken: list[c.Broken] = field(default_factory=list)
    quiet: list[tuple[float, float]] = field(default_factory=list)
    away: list[tuple[float, float]] = field(default_factory=list)  # the soak's mode switched away: (since, back)
    outages: list[tuple[float, float]] = field(default_factory=list)  # the API server not answering: (began, back)
    running: dict[str, float] = field(default_factory=dict)  # pod -> first seen running with its chips
    configs: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 1)])
    samples: list[c.HoldSample] = field(default_factory=list)
    allocations: list[c.NewAllocation] = field(default_factory=list)
    service: list[tuple[float, int]] = field(default_factory=list)  # (t, units in service) for the report
    faults_done: list[Step] = field(default_factory=list)
    invariants: dict[str, c.Invariant] = field(default_factory=dict)
    rollouts: list[c.Rollout] = field(default_factory=list)
    settle_s: float = SETTLE_S + 60  # at the end, how long everything may take to heal and come back

    def __post_init__(self) -> None:
        names = ("devices match", "no reset under a holder", "broken not given", "back in service", "bounded")
        names += ("kept in a rollout", "API requests per minute", "no admission refused by the agent")
        names += ("reset limit", "lying reset not trusted")
        self.invariants = {name: c.Invariant(name) for name in (*names, "nothing left")}
        self.api = Api(self.cluster.server, self.cluster.admin_tls())
        self.admin: Kubectl = self.cluster.admin
        self.chip_of = {uuid: index for index, uuid in enumerate(self.hardware.uuids)}
        self.held: dict[str, frozenset[int]] = {}  # pod -> chips last seen allocated
        self.verified: dict[str, frozenset[int]] = {}  # pod -> chips its container showed, matching its allocation
        self.last_tick = 0.0
        self.last_service: object = None
        self.resets_seen = 0
        self.pods_created = 0
        self.last_up: frozenset[int] = frozenset()  # DRA: the chips in service at the last tick
        self.settled_since: float | None = None  # since when the agent's DaemonSet has been settled
        self.failed: dict[str, str] = {}  # pod -> why it failed (admission refused, ...): reported, not yet judged
        self.actions = FaultActions(self)
        self.api_faults = ApiFaults(self)
        self.failures: list[c.Failure] = []
        self.deleted: set[str] = set()  # pods the soak asked to delete
        self.api_load = (0, 0)  # the agent's API requests: in all, and in its busiest minute
        self.dra = DraWatch(self, self.namespace)  # DRA mode: its config, shares, and prepares that failed
        self.cost = Cost()  # what the run costs the machine, for the report

    # ------------------------------------------------------------------ the run

    def now(self) -> float:
        return time.time() - self.start

    def note(self, text: str) -> None:
        self.events.append((self.now(), text))

    def run(self) -> None:
        self.start = time.time()
        self.cost.start()
        self.api_faults.disk.mount()
        try:
            self.run_mounted()
        finally:
            self.api_faults.heal_all()
            self.api_faults.disk.release()

    def run_mounted(self) -> None:
        if self.mode == "dra":  # admin-access claims (workload.py) are allowed in such a namespace only
            self.admin("label", "namespace", self.namespace, f"{workload.ADMIN_LABEL}=true", "--overwrite")
        first = draconfig.first_config(self.seed, self.mode)
        self.configs = [(0.0, first)]
        self.agent.set_config(first)
        self.agent.start()
        self.start = time.time()  # the schedule's times count from the agent's pod Ready (helm install: seconds)
        self.quiet.append((0.0, self.now()))
        self.note(f"agent started (pid {self.agent.pid})")
        pending = list(self.steps)
        while pending or self.actions.undo:
            due = self.now()
            while pending and pending[0].at <= due:
                self.actions.undo_due(pending[0].at)  # a fault over before this step (one that waits holds both up)
                self.do(pending.pop(0))
            self.actions.undo_due(due)
            self.tick()
            time.sleep(max(0.0, TICK_S - (self.now() - due)))
        self.wind_down()

    def do(self, step: Step) -> None:
        self.note(
            step.what() if step.is_fault else f"{step.kind} {step.detail.get('pod')} {step.detail.get('shape', '')}"
        )
        if step.kind == "pod-create":
            self.create_pod(str(step.detail["pod"]), str(step.detail["shape"]))
        elif step.kind == "pod-delete":
            self.delete_pod(str(step.detail["pod"]))
        elif step.kind in API_FAULTS:
            self.faults_done.append(step)
            self.api_faults.do(step)
        elif step.kind == "config-change" and self.mode == "dra":
            self.faults_done.append(step)
            self.dra.change_config(int(str(step.detail["config"])))
        else:
            self.faults_done.append(step)
            configs, began = len(self.configs), self.now()
            self.actions.do(step)
            self.dra.followed(configs, began)

    def wind_down(self) -> None:
        """Faults over: everything healed, returned and deleted; then every chip must come back within the bound
        and nothing may be left behind."""
        self.note("soak over: healing everything, deleting the workload")
        self.actions.heal_all()
        self.api_faults.heal_all()
        for pod in list(self.held) + self.actions.created:
            self.delete_pod(pod)
        deadline = self.now() + self.settle_s
        while self.now() < deadline:
            self.tick()
            if self.settled():
                break
            self.actions.return_open()
            time.sleep(TICK_S)
        self.all_back()
        for window in [w for w in self.broken if w.until is None]:
            what = f"chip {window.chip} ({window.why} at {window.since:.1f}) not healed within {self.settle_s:.0f} s"
            self.invariants["back in service"].check(False, self.now(), what + " of the end, the workload gone")
        self.judge_afterwards()

    def all_back(self) -> None:
        """The end: every chip in service again (each chip one check), the workload gone and everything healed."""
        invariant, at = self.invariants["back in service"], self.now()
        if self.mode == "dra":
            for chip in range(CHIPS):
                invariant.check(
                    chip in self.last_up,
                    at,
                    f"chip {chip} not in service at the end (in service: {sorted(self.last_up)})",
                )
        else:
            units, full = self.in_service_units(), self.full_units()
            invariant.check(units == full, at, f"allocatable {units} at the end, not {full}")

    def settled(self) -> bool:
        open_windows = [w for w in self.broken if w.until is None]
        full = self.in_service_units() == self.full_units()
        return not open_windows and not self.held and full and self.now() - self.quiet_end() > c.BOUND_S

    def quiet_end(self) -> float:
        return max((end for _, end in self.quiet), default=0.0)

    # ------------------------------------------------------------------ workload

    def create_pod(self, name: str, shape: str) -> None:
        try:
            if self.mode == "device-plugin":
                self.admin.create(busybox_pod(name, STAY, gpus=int(shape.split("-")[1])), "-n", self.namespace)
            else:
                claims, pods = workload.objects(name, shape, self.dra.unit())
                self.dra.created(name)
                self.admin.create(claims, "-n", self.namespace)
                self.admin.create(pods, "-n", self.namespace)
            self.actions.created.append(name)
            self.pods_created += 1
        except (KubectlError, AssertionError) as error:
            self.note(f"pod {name} not created: {str(error)[:200]}")

    def delete_pod(self, name: str) -> None:
        try:
            gone = ("--ignore-not-found", "--wait=false", "-n", self.namespace)
            self.deleted.update(workload.pods_of(name) if self.mode == "dra" else [name])
            self.admin("delete", "pod", *(workload.pods_of(name) if self.mode == "dra" else [name]), *gone)
            if self.mode == "dra":
                self.admin("delete", "resourceclaim", *workload.claims_of(name), *gone)
        except (KubectlError, AssertionError) as error:
            self.note(f"pod {name} not deleted: {str(error)[:200]}")
        if name in self.actions.created:
            self.actions.created.remove(name)

    # ------------------------------------------------------------------ observing

    def tick(self) -> None:
        at = self.now()
        self.cost.sample()
        try:
            pods = self.api.items(f"/api/v1/namespaces/{self.namespace}/pods")
            allocated = self.allocated(pods)
            self.dra.read_events(at)
        except OSError as error:  # the API server restarting: next tick
            self.note(f"API not readable: {error}")
            return
        self.observe_holdings(at, pods, allocated)
        self.observe_resets()
        self.observe_service(at)
        for pid in self.agent.pids:
            usage = process_usage(pid)
            if usage is not None:
                c.bounded(self.invariants["bounded"], at, *usage)
        self.observe_rollouts(at)
        self.last_tick = at

    def allocated(self, pods: list[dict[str, Any]]) -> dict[str, tuple[str, frozenset[int]]]:
        """Pod name -> (its uid, the chips its allocation names), from the kubelet (device plugin: its checkpoint)
        or the API server (DRA: the pod's claims' allocations)."""
        found: dict[str, tuple[str, frozenset[int]]] = {}
        if self.mode == "device-plugin":
            by_uid = checkpoint_devices(self.cluster.device_plugin_dir / "kubelet_internal_checkpoint")
            for pod in pods:
                ids = by_uid.get(pod["metadata"]["uid"], [])
                chips = frozenset(self.chip_of[i.split("::")[0]] for i in ids if i.split("::")[0] in self.chip_of)
                if chips:
                    found[pod["metadata"]["name"]] = (pod["metadata"]["uid"], chips)
            return found
        claims = {
            x["metadata"]["name"]: x
            for x in self.api.items(f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims")
        }
        given = {}  # pod -> its claims, for what each allocation gives (shares)
        for pod in pods:
            names = [ref.get("resourceClaimName") for ref in pod["spec"].get("resourceClaims") or []]
            devices = [d for n in names if n in claims for d in claim_devices(claims[n], DRIVER)]
            chips = frozenset(chip for d in devices for chip in workload.chips_of(d, self.hardware.board_of))
            if chips:
                found[pod["metadata"]["name"]] = (pod["metadata"]["uid"], chips)
                given[pod["metadata"]["name"]] = [claims[n] for n in names if n in claims]
        self.dra.allocated(given)
        return found

    def observe_holdings(self, at: float, pods: list[dict[str, Any]], allocated: dict[str, Any]) -> None:
        holdings = []
        for pod in pods:
            name = pod["metadata"]["name"]
            status = pod.get("status") or {}
            if status.get("phase") == "Failed" and name not in self.failed:
                self.failed[name] = f"{status.get('reason', '')}: {status.get('message', '')}"[:300]
                if name not in self.deleted:  # a pod deleted before it ran is failed too, with no reason
                    self.failures.append(c.Failure(at, name, status.get("reason", ""), status.get("message", "")))
                self.note(f"{name} failed: {self.failed[name]}")
            if name not in allocated:
                continue
            chips = allocated[name][1]
            if name not in self.held:
                self.allocations.append(c.NewAllocation(name, chips, self.last_tick, at))
                self.note(f"{name} allocated chips {sorted(chips)}")
            if certainly_running(pod):
                self.running.setdefault(name, at)
                if name not in self.verified:
                    self.verify(at, name, chips)
                holdings.append(c.Holding(name, self.verified.get(name, chips)))
        for gone in set(self.held) - set(allocated):
            self.note(f"{gone} no longer holds chips {sorted(self.held[gone])}")
            self.verified.pop(gone, None)
        self.held = {name: chips for name, (_, chips) in allocated.items()}
        self.samples.append(c.HoldSample(at, tuple(holdings)))

    def verify(self, at: float, name: str, chips: frozenset[int]) -> None:
        """Exec into the container: its device nodes and CoreX variables against its allocation."""
        try:
            output = self.admin("exec", name, "-n", self.namespace, "-c", "main", "--", "sh", "-c", SHOW, timeout=30)
        except (KubectlError, AssertionError) as error:
            self.note(f"exec into {name} failed (checked at its next tick): {str(error)[:160]}")
            return
        nodes, env = shown(output)
        given = self.dra.given.get(name) if self.mode == "dra" else None
        seen = c.Seen(at, name, nodes, env, self.expected_sets(name, chips), given)
        invariant = self.invariants["devices match"]
        before = len(invariant.violations)
        c.devices_match(invariant, seen, self.hardware.uuids, DEVICE_MAJOR, CONTROL_MINOR)
        if len(invariant.violations) == before and self.mode == "dra":
            self.dra.verified(invariant, at, name, env)
        if len(invariant.violations) == before:
            self.verified[name] = frozenset(self.chip_of[u] for u in env.get("IX_VISIBLE_DEVICES", "").split(","))

    def expected_sets(self, name: str, named: frozenset[int]) -> tuple[frozenset[int], ...]:
        """The chips an allocation naming these chips means: a whole board's unless the board was split when it was
        made; both when the config changed around then."""
        if self.mode == "dra":
            return (named,)
        boards = frozenset(chip for n in named for chip in self.hardware.board_of(n))
        allocation = next(a for a in reversed(self.allocations) if a.pod == name)
        configs = {index for t, index in self.configs if allocation.after - 3 <= t <= allocation.seen}
        configs.add(self.config_at(allocation.after - 3))
        split = {draconfig.splitboard(DEVICE_PLUGIN_CONFIGS[i]) for i in configs}
        return tuple(named if s else boards for s in sorted(split, reverse=True))

    def config_at(self, at: float) -> int:
        return [index for t, index in self.configs if t <= at][-1] if self.configs[0][0] <= at else self.configs[0][1]

    def observe_resets(self) -> None:
        resets = [r for r in read_resets(self.hardware.reset_log, self.chip_of, self.start) if r.ended is not None]
        for reset in resets[self.resets_seen :]:
            outcome = "ok" if reset.ok else "failed"
            self.note(f"agent reset chips {sorted(reset.chips)} ({reset.started:.1f}-{reset.ended:.1f} s, {outcome})")
            self.actions.reset_seen(reset)
        self.resets_seen = len(resets)

    def observe_service(self, at: float) -> None:
        invariant = self.invariants["back in service"]
        if self.mode == "dra":
            slices = self.api.items("/apis/resource.k8s.io/v1/resourceslices")
            devices = [d for s in slices if s["spec"].get("driver") == DRIVER for d in s["spec"].get("devices") or []]
            board_of = self.hardware.board_of
            up = frozenset(
                chip for d in devices if not d.get("taints") for chip in workload.chips_of(d["name"], board_of)
            )
            self.last_up = up
            self.actions.windows.seen_back(at, lambda chip: chip in up)
            sample = c.ServiceSample(at, in_service=up)
            c.back_in_service(invariant, sample, CHIPS, self.broken, self.quiet, together=self.dra.together(at))
            units = len(up)
        else:
            node = self.api.get(f"/api/v1/nodes/{self.cluster.node_name}")
            units = int(node["status"].get("allocatable", {}).get(RESOURCE, "0"))
            self.actions.windows.seen_back(at, lambda chip: self.counted_in(units, chip))
            expected = self.units_of(lambda chip: c.healthy_since(chip, at, self.broken, self.quiet))
            sample = c.ServiceSample(at, allocatable=units)
            c.back_in_service(invariant, sample, CHIPS, [], [], expected)
        for rollout in self.rollouts:
            without = None if self.mode == "dra" else lambda out: self.units_of(lambda chip: chip not in out)
            together = self.dra.together(at) if self.mode == "dra" else []
            c.kept_in_rollout(
                self.invariants["kept in a rollout"], rollout, sample, self.broken, self.quiet, without, together
            )
        self.actions.judge_lies(sample)
        if units != self.last_service:
            self.note(f"in service: {units}")
            self.last_service = units
        self.service.append((at, units))

    def observe_rollouts(self, at: float) -> None:
        """A rollout is done once the DaemonSet has had only its one up-to-date pod, available, for
        ROLLOUT_SETTLED_S (read every tick while one is under way)."""
        under_way = [rollout for rollout in self.rollouts if rollout.done is None]
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
            self.settled_since = None
            return
        # Settled a while: a `helm rollback` right after an upgrade reads settled before the DaemonSet starts over.
        self.settled_since = self.settled_since or at
        if at - self.settled_since >= c.ROLLOUT_SETTLED_S:
            for rollout in under_way:
                rollout.done = self.settled_since
                self.note(f"{rollout.what} done ({rollout.done - rollout.began:.1f} s)")

    def units_of(self, healthy: Any) -> int:
        """Allocatable of the device plugin's config now when exactly the chips healthy(chip) are healthy."""
        config = self.agent.base_config | DEVICE_PLUGIN_CONFIGS[self.config_at(self.now())]  # as Agent.set_config
        replicas = max(1, draconfig.replicas(config))
        if draconfig.splitboard(config):
            return replicas * sum(1 for chip in range(CHIPS) if healthy(chip))
        boards = {frozenset(self.hardware.board_of(chip)) for chip in range(CHIPS)}
        return replicas * sum(1 for board in boards if all(healthy(chip) for chip in board))

    def counted_in(self, allocatable: int, chip: int) -> bool:
        """Device plugin: whether the chip is in service, as far as one count tells (Windows.counted_in)."""
        return self.actions.windows.counted_in(allocatable, chip, self.now(), self.units_of)

    def full_units(self) -> int:
        return CHIPS if self.mode == "dra" else self.units_of(lambda chip: True)

    def in_service_units(self) -> int:
        return self.service[-1][1] if self.service else -1

    # ------------------------------------------------------------------ judging

    def judge_afterwards(self) -> None:
        for directory in (self.cluster.cdi_dir, self.cluster.plugins_dir, self.cluster.device_plugin_dir):
            files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if not p.is_dir())
            self.note(f"files in {directory}: {', '.join(files) or 'none'}")
        resets = read_resets(self.hardware.reset_log, self.chip_of, self.start)
        c.no_reset_under_holder(self.invariants["no reset under a holder"], resets, self.samples)
        self.actions.judge_limits(resets, self.now())
        given = self.allocations
        if self.mode == "dra":
            given = c.given_by_prepare(self.allocations, self.away, self.running)
        outages = self.outages if self.mode == "dra" else []  # the device plugin tells the kubelet directly
        c.broken_not_given(self.invariants["broken not given"], given, self.broken, outages)
        c.admission_failures(
            self.invariants["no admission refused by the agent"], self.failures, self.quiet, self.broken
        )
        self.dra.judge(self.invariants["no admission refused by the agent"])
        self.judge_api_load()
        agent_files: list[Path] = []
        found = leftovers(
            self.cluster.device_plugin_dir,
            self.cluster.cdi_dir,
            self.cluster.plugins_dir,
            agent_files,
            agent_running=True,
        )
        c.nothing_left(self.invariants["nothing left"], self.now(), found)
        self.agent.stop()
        self.note("agent stopped")  # stop() returns once the process has exited: its files are gone by then
        found = leftovers(
            self.cluster.device_plugin_dir,
            self.cluster.cdi_dir,
            self.cluster.plugins_dir,
            agent_files,
            agent_running=False,
        )
        c.nothing_left(self.invariants["nothing left"], self.now(), found)

    def judge_api_load(self) -> None:
        """The agent's requests per minute, from the API server's audit log."""
        requests = agent_requests(self.cluster.audit_log, self.start)
        per_minute = [
            sum(1 for r in requests if m * 60 <= r.at < (m + 1) * 60) for m in range(int(self.now() // 60) + 1)
        ]
        self.api_load = (len(requests), max(per_minute))
        self.note(f"the agent's API requests: {len(requests)}, per minute {per_minute}")
        c.requests_per_minute(self.invariants["API requests per minute"], requests, self.now())


def stop(soak: Soak) -> None:
    """The agent uninstalled, after the workload is gone where the soak did not get to its end (a DRA claim's pod
    is only removed once the driver has unprepared it)."""
    if soak.agent.installed:
        with contextlib.suppress(KubectlError, AssertionError):
            soak.admin("delete", "pods", "--all", "-n", soak.namespace, "--wait=true", "--timeout=90s", timeout=120)
    soak.agent.stop()
