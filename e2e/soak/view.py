"""What the soak does and reads that depends on the agent's mode, as one interface: each mode's view (dpview.py,
draview.py) makes the workload, reads allocations and what is in service, and judges them as that mode shows them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from harness.cluster import Cluster
from harness.kube import Kubectl

from . import checker as c
from .agent import Agent
from .hardware import Hardware
from .observe import Api
from .schedule import DEVICE_PLUGIN_CONFIGS
from .timeline import Timeline
from .windows import Windows

Pod = dict[str, Any]
Allocated = dict[str, tuple[str, frozenset[int]]]  # pod name -> (its uid, the chips its allocation names)


class ModeView(ABC):
    mode: str
    state_directories: tuple[str, ...]  # the agent's, under the kubelet's plugins directory (apifaults.StateDisk)
    restarts_for_config = False  # the agent reads its config only at start: a change restarts its pod
    service_label: str  # what counts as in service, for the report's plot

    def __init__(
        self,
        cluster: Cluster,
        api: Api,
        namespace: str,
        agent: Agent,
        hardware: Hardware,
        timeline: Timeline,
        windows: Windows,
    ) -> None:
        self.cluster, self.api, self.namespace = cluster, api, namespace
        self.agent, self.hardware, self.timeline, self.windows = agent, hardware, timeline, windows
        self.admin: Kubectl = cluster.admin

    def config(self, at: float) -> dict[str, Any]:
        """The ix-config in force at `at` (as Agent.values writes it)."""
        return self.agent.base_config | DEVICE_PLUGIN_CONFIGS[self.timeline.config_at(at)]

    @abstractmethod
    def prepare(self) -> None:
        """The soak's namespace made ready for the mode's workload."""

    @abstractmethod
    def create(self, name: str, shape: str) -> None:
        """The workload `name` of the schedule's shape created (KubectlError where the API refused it)."""

    @abstractmethod
    def pods_of(self, name: str) -> list[str]: ...

    @abstractmethod
    def claims_of(self, name: str) -> list[str]: ...

    @abstractmethod
    def allocated(self, pods: list[Pod]) -> Allocated:
        """This look's pods that hold chips, from where the mode keeps allocations."""

    @abstractmethod
    def read_events(self, at: float) -> None:
        """The mode's Events since the last look."""

    @abstractmethod
    def read_service(self, at: float) -> tuple[c.ServiceSample, int]:
        """What is in service now, as a sample and a count of units."""

    @abstractmethod
    def in_service(self, chip: int) -> bool:
        """Whether the chip was in service at the last look."""

    @abstractmethod
    def judge_service(self, invariant: c.Invariant, sample: c.ServiceSample) -> None:
        """Judges "back in service" at this look."""

    @abstractmethod
    def judge_rollout(self, invariant: c.Invariant, rollout: c.Rollout, sample: c.ServiceSample) -> None:
        """Judges "kept in a rollout" at this look."""

    @abstractmethod
    def ceiling_without(self, out: frozenset[int]) -> int | None:
        """The most the node may count in service with the chips `out` out (None: the mode shows each chip)."""

    @abstractmethod
    def before_rollout(self) -> frozenset[int] | int:
        """What was in service at the last look, as a rollout keeps it."""

    @abstractmethod
    def full_units(self) -> int: ...

    @abstractmethod
    def all_back(self, invariant: c.Invariant, at: float) -> None:
        """The end: everything in service again."""

    @abstractmethod
    def expected_sets(self, name: str, named: frozenset[int]) -> tuple[frozenset[int], ...]:
        """The chips a container may rightly show for an allocation naming `named`."""

    @abstractmethod
    def given_to(self, pod: str) -> tuple[c.Given, ...] | None:
        """What the pod's allocation gives, device by device, where the mode says (DRA's shares)."""

    @abstractmethod
    def verified(self, invariant: c.Invariant, at: float, pod: str, env: dict[str, str]) -> None:
        """A container shown to hold what its allocation names: what else the mode checks of it."""

    @abstractmethod
    def judge_given(self, invariant: c.Invariant) -> None:
        """Judges "broken not given", afterwards."""

    @abstractmethod
    def judge(self, invariant: c.Invariant) -> None:
        """Judges "no admission refused by the agent", afterwards: what the mode's Events add."""
