"""How much each benchmark does: the full run, or a smoke run that only proves every benchmark works."""

from __future__ import annotations

from dataclasses import dataclass

from bench.load import Load


@dataclass(frozen=True)
class Settings:
    """Repetition counts and durations of every benchmark."""

    smoke: bool
    startup_runs: int
    reregistrations: int
    health_flips: int
    health_interval: float
    load: Load
    listwatch_runs: int
    footprint_calls: int
    footprint_chunks: int
    idle_seconds: float
    settle_seconds: float
    stops: int
    kubeclient_runs: int
    placement_runs: int
    healing_runs: int = 10
    healing_storm: int = 1000
    handovers: int = 20  # device plugin updates on one node, one after the other
    fleet_nodes: tuple[int, ...] = (100, 250, 500)  # hollow nodes of each fleet size (`--only fleet`)
    fleet_pods: int = 1000  # pods per shape the scheduler places (fewer where a fleet has less room)
    fleet_rest_seconds: float = 60.0  # the windows at rest, during XIDs and after an API server restart


FULL = Settings(
    smoke=False,
    startup_runs=10,
    reregistrations=50,
    health_flips=12,
    health_interval=1.0,
    load=Load(calls=5_000, callers=16, warmup=500, rounds=5),
    listwatch_runs=50,
    footprint_calls=100_000,
    footprint_chunks=10,
    idle_seconds=60.0,
    settle_seconds=2.0,
    stops=200,
    kubeclient_runs=10,
    placement_runs=2_000,
)

SMOKE = Settings(
    smoke=True,
    startup_runs=1,
    reregistrations=2,
    health_flips=2,
    health_interval=0.2,
    load=Load(calls=48, callers=16, warmup=16),
    listwatch_runs=2,
    footprint_calls=400,
    footprint_chunks=4,
    idle_seconds=1.0,
    settle_seconds=0.2,
    stops=2,
    kubeclient_runs=1,
    placement_runs=20,
    healing_runs=1,
    healing_storm=50,
    handovers=2,
    fleet_nodes=(5,),
    fleet_pods=20,
    fleet_rest_seconds=3.0,
)
