"""What happened in the soak: its clock, its notes, and every record of the run the checker and the report read.

Each part of the soak writes here what it did or saw (a fault's quiet window, a chip broken, a pod's allocation,
what was in service); none of them holds another part to learn it. Plain data: nothing of the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import checker as c
from .schedule import Step

Span = tuple[float, float]


@dataclass
class Timeline:
    clock: Callable[[], float] = time.time  # the wall clock (a test hands in its own)
    start: float = 0.0  # the clock when the schedule's time 0 was: the agent's pod Ready
    events: list[tuple[float, str]] = field(default_factory=list)  # the notes, for the report
    faults_done: list[Step] = field(default_factory=list)
    # The model of the node's chips and of the agent's life
    broken: list[c.Broken] = field(default_factory=list)  # every window of a broken chip, open or closed
    quiet: list[Span] = field(default_factory=list)  # a while in which everything may be out (restarts, changes)
    away: list[Span] = field(default_factory=list)  # the soak's mode switched away: (since, back)
    outages: list[Span] = field(default_factory=list)  # the API server not answering: (began, back)
    starts: list[tuple[float, float | None]] = field(default_factory=list)  # a new agent process may start then
    configs: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 1)])  # (since, config index)
    config_changes: list[Span] = field(default_factory=list)  # DRA: each restart for a config (began, in force)
    rollouts: list[c.Rollout] = field(default_factory=list)
    settled_since: float | None = None  # since when the agent's DaemonSet has been settled (None: not now)
    # What the workload was given and what was in service
    pods_created: int = 0
    deleted: set[str] = field(default_factory=set)  # pods the soak asked to delete
    failed: dict[str, str] = field(default_factory=dict)  # pod -> why it failed (admission refused, ...)
    failures: list[c.Failure] = field(default_factory=list)  # those the checker judges
    running: dict[str, float] = field(default_factory=dict)  # pod -> first seen running with its chips
    allocations: list[c.NewAllocation] = field(default_factory=list)
    samples: list[c.HoldSample] = field(default_factory=list)
    service: list[tuple[float, int]] = field(default_factory=list)  # (t, units in service)
    api_load: tuple[int, int] = (0, 0)  # the agent's API requests: in all, and in its busiest minute

    def now(self) -> float:
        return self.clock() - self.start

    def begin(self) -> None:
        """The schedule's time 0 is now."""
        self.start = self.clock()

    def note(self, text: str) -> None:
        self.events.append((self.now(), text))

    def config_at(self, at: float) -> int:
        """The index of the config in force at `at`."""
        return [index for t, index in self.configs if t <= at][-1] if self.configs[0][0] <= at else self.configs[0][1]

    def quiet_at(self, at: float, after: float = 0.0) -> bool:
        """Whether `at` falls in a quiet window, or within `after` of its end."""
        return any(begin <= at <= end + after for begin, end in self.quiet)

    def quiet_end(self) -> float:
        return max((end for _, end in self.quiet), default=0.0)

    def in_service_units(self) -> int:
        """What was in service at the last look (-1 before the first)."""
        return self.service[-1][1] if self.service else -1

    def unsettled(self) -> None:
        """The agent's DaemonSet is changing (a rollout, a switch): settled again only from a later look."""
        self.settled_since = None
