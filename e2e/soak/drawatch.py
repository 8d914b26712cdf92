"""What the soak does and watches in DRA mode only, beside the runner: the config in force and its live change,
what each claim's allocation gives (shares included) and what a container holding shares shows, and the kubelet's
Events of prepares that failed."""

from __future__ import annotations

from typing import Any

from . import checker as c
from . import dracheck, draconfig, workload
from .agent import NAMESPACE as AGENT_NAMESPACE
from .agent import container_id
from .run import SoakRun
from .schedule import CHIPS, DEVICE_PLUGIN_CONFIGS

CONFIG_QUIET_S = 5.0  # after a config change's rollout is done, as for the device plugin's (faults.py)
EVENT_LAG_S = 2.0  # an Event's time is in whole seconds and the soak notes a deletion at its next tick


class DraWatch:
    def __init__(self, soak: SoakRun, namespace: str) -> None:
        self.soak, self.namespace = soak, namespace
        self.given: dict[str, tuple[c.Given, ...]] = {}  # pod -> the devices and shares its claims give
        self.shown: dict[str, tuple[tuple[c.Given, ...], dict[str, str]]] = {}  # pod -> (given, its variables)
        self.counted: dict[str, int] = {}  # Event name -> its count seen
        self.failures: list[dracheck.PrepareFailure] = []
        self.deleted_at: dict[str, float] = {}
        self.created_at: dict[str, float] = {}  # pod -> when the soak created it (its claims with it)
        self.changes: list[tuple[float, float]] = []  # each config change: (began, in force)
        self.claim_pods: dict[str, str] = {}  # claim UID -> its pod, of every claim seen allocated

    # ------------------------------------------------------------------ the config

    def config(self, at: float) -> dict[str, Any]:
        """The ix-config in force at `at` (as Agent.values writes it)."""
        return self.soak.agent.base_config | DEVICE_PLUGIN_CONFIGS[self.soak.config_at(at)]

    def unit(self) -> str:
        """The DeviceClass a share shape claims of now."""
        return draconfig.share_class(self.config(self.soak.now()))

    def together(self, at: float) -> list[frozenset[int]]:
        return draconfig.together(self.config(at), CHIPS, self.soak.hardware.board_of)

    def change_config(self, index: int) -> None:
        """The operator's live change: `helm upgrade` of `config.content` (and the pod annotation, so that the
        revision's pods are its config's), then the driver's pod restarted: the driver reads its config at start
        (docs/dra.md), and a DaemonSet's rolling update is not waited for."""
        began = self.soak.now()  # the upgrade's rolling update may start a driver with the new config at once
        self.soak.agent.config_index = index
        self.soak.agent.rollout()
        self.restart_for_config(began)

    def followed(self, configs_before: int, began: float) -> None:
        """After a fault that began at `began`: one that set another config (a `helm rollback` brings its revision's
        back, its rolling update starting a driver with it at once) has it in force once the driver's pod is
        restarted."""
        if self.soak.mode == "dra" and len(self.soak.configs) > configs_before:
            self.restart_for_config(began)

    def restart_for_config(self, began: float) -> None:
        soak, agent = self.soak, self.soak.agent
        soak.actions.new_agent_process()
        pod = agent.newest()
        soak.admin.delete("pod", pod["metadata"]["name"], AGENT_NAMESPACE, wait=False)
        agent.starts += 1
        agent.wait_settled(other_than=container_id(pod))
        index = agent.config_index
        soak.configs.append((soak.now(), index))
        self.changes.append((began, soak.now()))
        soak.quiet.append((began, soak.now() + CONFIG_QUIET_S))
        soak.note(
            f"config {index} in force: {DEVICE_PLUGIN_CONFIGS[index]} (pod restarted, {soak.now() - began:.1f} s)"
        )

    # ------------------------------------------------------------------ what containers hold

    def allocated(self, claims: dict[str, list[dict[str, Any]]]) -> None:
        """This tick's pods with allocated claims (pod -> its claims): what each one's allocation gives."""
        hardware = self.soak.hardware
        chips_of = lambda device: workload.chips_of(device, hardware.board_of)  # noqa: E731
        self.given = {
            pod: dracheck.given(made, draconfig.DRIVER, chips_of, hardware.uuids) for pod, made in claims.items()
        }
        self.claim_pods |= dracheck.claim_uids(claims)

    def verified(self, invariant: c.Invariant, at: float, pod: str, env: dict[str, str]) -> None:
        """A container shown to hold what its allocation gives: its share slots apart from every other container's
        that still holds its allocation."""
        self.shown = {name: shown for name, shown in self.shown.items() if name in self.given}
        mine = self.given.get(pod, ())
        if any(device.share for device in mine):
            c.slots_apart(invariant, at, pod, mine, env, self.shown)
            self.soak.note(f"{pod} shows its shares: IX_REPLICA_DEVICES={env.get(c.REPLICAS, '')}")
        self.shown[pod] = (mine, env)

    # ------------------------------------------------------------------ prepares that failed

    def created(self, name: str) -> None:
        """The soak created the workload `name` now: none of its claims was allocated before."""
        for pod in workload.pods_of(name):
            self.created_at[pod] = self.soak.now()

    def read_events(self, at: float) -> None:
        """The kubelet's FailedPrepareDynamicResources Events on the soak's pods since the last read; those of a
        pod the soak has deleted by then are its own doing (the claim deleted with it)."""
        if self.soak.mode != "dra":
            return
        for name in self.soak.deleted:
            self.deleted_at.setdefault(name, at)
        query = f"fieldSelector=reason%3D{dracheck.REASON}"
        events = self.soak.api.items(f"/api/v1/namespaces/{self.namespace}/events?{query}")
        for failure in dracheck.new_failures(events, self.soak.start, at, self.counted):
            deleted = self.deleted_at.get(failure.pod)
            if deleted is not None and failure.at >= deleted - EVENT_LAG_S:
                continue
            self.failures.append(failure)
            self.soak.note(f"{failure.pod} prepare failed: {failure.message[:240]}")

    def judge(self, invariant: c.Invariant) -> None:
        soak = self.soak
        # the earliest its claims may have been allocated: the soak's last look before it saw them allocated, else
        # the pod's creation (the soak does not look while it restarts the agent)
        allocated = self.created_at | {a.pod: a.after for a in reversed(soak.allocations)}
        dracheck.prepare_failures(
            invariant, self.failures, soak.quiet, soak.broken, soak.chip_of, self.changes, allocated, self.claim_pods
        )
