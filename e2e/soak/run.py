"""What the fault actions (faults.py, apifaults.py) and the DRA watch (drawatch.py) see of the soak that runs them:
the runner's Soak, as a Protocol, so that they need not import the runner that imports them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from harness.cluster import Cluster
from harness.kube import Kubectl

from . import checker as c
from .agent import Agent
from .hardware import Hardware
from .observe import Api


class Later(Protocol):
    def later(self, seconds: float, action: Callable[[], None]) -> None: ...


class SoakRun(Protocol):
    cluster: Cluster
    mode: str
    agent: Agent
    hardware: Hardware
    admin: Kubectl
    start: float
    quiet: list[tuple[float, float]]
    away: list[tuple[float, float]]
    outages: list[tuple[float, float]]
    broken: list[c.Broken]
    configs: list[tuple[float, int]]
    rollouts: list[c.Rollout]
    chip_of: dict[str, int]
    last_up: frozenset[int]
    settled_since: float | None
    actions: Any  # the runner's FaultActions (faults.py): what is undone later
    api: Api
    deleted: set[str]
    invariants: dict[str, c.Invariant]

    def now(self) -> float: ...

    def note(self, text: str) -> None: ...

    def config_at(self, at: float) -> int: ...

    def in_service_units(self) -> int: ...

    def counted_in(self, allocatable: int, chip: int) -> bool: ...

    def units_of(self, healthy: Any) -> int: ...

    def observe_resets(self) -> None: ...
