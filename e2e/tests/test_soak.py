"""The chaos soak (e2e/soak/): a seeded schedule of faults and workload against the agent on the real node, the
invariants judged from outside. `make soak` runs it alone (SOAK_MINUTES, SOAK_SEED, SOAK_MODE); `make e2e` runs a
short one per mode on the session's cluster, with the seed 1 and every seed of e2e/soak/regression-seeds.txt.
"""

from __future__ import annotations

import functools
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.dra import delete_slices
from harness.project_image import BuiltImage
from soak import report
from soak.agent import Agent
from soak.faults import NODE_DIR, NODE_RECORD
from soak.hardware import Hardware
from soak.returns import RETURN_ANNOTATION
from soak.runner import Soak, stop
from soak.schedule import MODES, Step, draw

DEFAULT_SEED = 1
REGRESSION_SEEDS = Path(__file__).resolve().parents[1] / "soak" / "regression-seeds.txt"


def regression_seeds() -> list[tuple[str | None, int, float | None]]:
    """(mode or None for both, seed, minutes or None) of each line `<seed> [mode [minutes]]  # what it found` of the
    regression seeds file (minutes: how much of the schedule it takes to meet the defect again, when over the one
    minute a replay runs by default)."""
    found = []
    for line in REGRESSION_SEEDS.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            mode = words[1] if len(words) > 1 and words[1] != "-" else None
            found.append((mode, int(words[0]), float(words[2]) if len(words) > 2 else None))
    return found


@functools.cache
def soak_runs() -> list[tuple[str, int, float | None]]:
    """(mode, seed, minutes or None for SOAK_MINUTES) of each soak to run (drawn once: a random seed names its run)."""
    modes = [os.environ["SOAK_MODE"]] if os.environ.get("SOAK_MODE") else list(MODES)
    seed = os.environ.get("SOAK_SEED", "")
    if seed == "random":
        drawn = random.SystemRandom().randrange(1, 1_000_000)
        return [(mode, drawn, None) for mode in modes]
    if seed:
        return [(mode, int(seed), None) for mode in modes]
    extra = [
        (mode, s, minutes)
        for mode in modes
        for m, s, minutes in regression_seeds()
        if m in (None, mode) and s != DEFAULT_SEED
    ]
    return [(mode, DEFAULT_SEED, None) for mode in modes] + extra


@pytest.fixture
def clean_node(cluster: Cluster) -> Iterator[None]:
    """A node as new before and after: no operator's return annotation, no stale slices and no node-health record
    (a soak that stopped half way, or another scenario, may have left a chip waiting for an operator in it, which
    the agent rightly keeps out of service: the next soak's model starts from every chip healthy)."""

    def clean() -> None:
        cluster.admin("annotate", "node", cluster.node_name, f"{RETURN_ANNOTATION}-")
        delete_slices(cluster.admin)
        for record in (cluster.plugins_dir / NODE_DIR).glob(f"{NODE_RECORD}*"):
            record.unlink()

    clean()
    yield
    clean()


@pytest.mark.parametrize(("mode", "seed", "minutes"), soak_runs(), ids=[f"{m}-seed{s}" for m, s, _ in soak_runs()])
def test_soak(
    mode: str,
    seed: int,
    minutes: float | None,
    cluster: Cluster,
    namespace: str,
    log_dir: Path,
    tmp_path: Path,
    clean_node: None,
    project_image: BuiltImage,
    record_property: Callable[[str, object], None],
) -> None:
    minutes = minutes or float(os.environ.get("SOAK_MINUTES") or 1)
    hardware = Hardware(tmp_path / "hardware")
    agent = Agent(cluster, mode, log_dir / f"soak-{mode}-seed{seed}-agent", hardware)  # its pods' logs: with the report
    soak = Soak(cluster, namespace, mode, seed, draw(seed, minutes, mode), agent, hardware)
    began = time.monotonic()
    try:
        soak.run()
    finally:
        stop(soak)
        path = report.write(soak, log_dir, minutes)
        line = report.summary(soak)
        # Reaches the run's last lines through the test's report (conftest.py), also from a pytest-xdist worker.
        took = time.monotonic() - began
        record_property(report.REPORT_PROPERTY, f"soak {mode} seed {seed}: {took:.0f} s, report {path}")
        record_property(report.SUMMARY_PROPERTY, line)
    violations = [(name, v) for name, i in soak.invariants.items() for v in i.violations]
    assert not violations, f"{line}\nreport: {path}\n" + "\n".join(f"{n}: t+{t:.1f}s {w}" for n, (t, w) in violations)


def test_the_soak_catches_a_broken_chip_handed_out_and_a_rollout_that_drops_allocatable(
    cluster: Cluster, namespace: str, log_dir: Path, tmp_path: Path, clean_node: None, project_image: BuiltImage
) -> None:
    """The checker's own test on the real node, two deliberate defects in one run (one install):

    - the agent is told to ignore XID 48 (`health.ignore`, through the chart's config), so the board of a chip that
      reported it stays in service and new pods get it: "broken not given" must report it;
    - the chart has a careless updateStrategy (maxSurge 0, maxUnavailable 1: the old pod stopped before the new one
      starts) and zeroDowntimeUpgrade off, so a `helm upgrade` leaves the node without the plugin a while:
      "kept in a rollout" must report the allocatable that dropped."""
    hardware = Hardware(tmp_path / "hardware")
    agent = Agent(cluster, "device-plugin", tmp_path / "agent", hardware)
    agent.base_config = {"health": {"ignore": [48]}}
    stop_first = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    agent.overrides = {"updateStrategy": stop_first, "zeroDowntimeUpgrade": "false"}
    steps = [Step(2.0, "xid-reset", (0,), 0.0, {"xid": 48})]
    steps += [Step(8.0 + i, "pod-create", (), 0.0, {"pod": f"selftest-{i}", "shape": "gpus-1"}) for i in range(2)]
    steps += [Step(14.0, "rollout")]
    # The run goes on well past the rollout: on a busy machine (clusters side by side) the DaemonSet controller once
    # had not replaced the pod before a run ending at 25 s, and a stalled controller is restarted only after
    # agent.STALLED_S (45 s); the drop must fall inside the run to be seen.
    steps += [Step(75.0, "pod-create", (), 0.0, {"pod": "selftest-late", "shape": "gpus-1"})]
    soak = Soak(cluster, namespace, "device-plugin", 0, steps, agent, hardware, settle_s=5)
    try:
        soak.run()
    finally:
        stop(soak)
        path = report.write(soak, log_dir, 0.3)
    caught = soak.invariants["broken not given"].violations
    assert caught and "chip 0" in caught[0][1] and "XID 48" in caught[0][1], path
    dropped = soak.invariants["kept in a rollout"].violations
    assert dropped and "allocatable 0 < 1" in dropped[0][1], path  # 1: the board without the broken chip
