"""The chaos soak's checker shown on the real node to catch what it is there for (e2e/soak/): a pod the agent refused
at admission, and deliberately broken builds of the agent (e2e/soak/breaks.py) for the invariants no config of the
agent can break."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.dra import delete_slices
from harness.project_image import BuiltImage
from soak import breaks, report
from soak.agent import Agent
from soak.checker import BOUND_S, MAX_OPEN_FILES
from soak.faults import RETURN_ANNOTATION
from soak.hardware import Hardware
from soak.runner import Soak, stop
from soak.schedule import Step

CDI_PREFIX = "gpu.iluvatar.com-claim_"  # the driver's per-claim CDI spec files


@pytest.fixture
def clean_node(cluster: Cluster) -> Iterator[None]:
    cluster.admin("annotate", "node", cluster.node_name, f"{RETURN_ANNOTATION}-")
    delete_slices(cluster.admin)
    yield
    cluster.admin("annotate", "node", cluster.node_name, f"{RETURN_ANNOTATION}-")
    delete_slices(cluster.admin)


def soak_of(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    steps: list[Step],
    config: dict[str, object],
    mode: str = "device-plugin",
    broken: tuple[str, ...] = (),
    settle_s: float = 5,
) -> Soak:
    hardware = Hardware(tmp_path / "hardware")
    agent = Agent(cluster, mode, tmp_path / "agent", hardware)
    agent.base_config = config
    breaks.install(agent, broken)
    return Soak(cluster, namespace, mode, 0, steps, agent, hardware, settle_s=settle_s)


def run(soak: Soak, log_dir: Path) -> Path:
    try:
        soak.run()
    finally:
        stop(soak)
        path = report.write(soak, log_dir, 0.2)
    return path


def test_the_soak_catches_a_pod_the_agent_refused_at_admission(
    cluster: Cluster, namespace: str, log_dir: Path, tmp_path: Path, clean_node: None, project_image: BuiltImage
) -> None:
    """The agent told to refuse a container asking for more than one shared replica
    (`failRequestsGreaterThanOne`) fails a pod asking for two at admission: "no admission refused by the agent"
    must report it."""
    sharing = {"sharing": {"timeSlicing": {"replicas": 2, "failRequestsGreaterThanOne": True}}}
    steps = [Step(3.0, "pod-create", (), 0.0, {"pod": "selftest-two", "shape": "gpus-2"})]
    steps += [Step(25.0, "pod-delete", (), 0.0, {"pod": "selftest-two"})]  # long after the kubelet failed it
    soak = soak_of(cluster, namespace, tmp_path, steps, sharing)
    path = run(soak, log_dir)
    caught = soak.invariants["no admission refused by the agent"].violations
    assert caught and "selftest-two" in caught[0][1], path


def violations(soak: Soak, name: str) -> list[str]:
    return [what for _, what in soak.invariants[name].violations]


def test_the_soak_catches_a_broken_build_of_the_device_plugin(
    cluster: Cluster, namespace: str, log_dir: Path, tmp_path: Path, clean_node: None, project_image: BuiltImage
) -> None:
    """Four defects of the agent in one install (breaks.py), none hiding another: two pods hold both boards (whole
    boards), then chip 0 reports XID 48 (policy reset); the pods are deleted 12 s later.

    - Allocate names one chip fewer in IX_VISIBLE_DEVICES than it gives: "devices match" reports each pod;
    - the chip guard answers "free" for a held chip: the agent resets chip 0 under its pod, "no reset under a holder";
    - a device once listed Unhealthy stays so: the reset heals chip 0 but its board never comes back, "back in
      service" (30 s after the reset, and at the end);
    - every read of the devices file leaks 5 descriptors: "bounded" (over 200 open files in about 20 s)."""
    steps = [Step(2.0 + i, "pod-create", (), 0.0, {"pod": f"selftest-{i}", "shape": "gpus-1"}) for i in range(2)]
    steps += [Step(12.0, "xid-reset", (0,), 0.0, {"xid": 48})]
    steps += [Step(24.0, "pod-delete", (), 0.0, {"pod": f"selftest-{i}"}) for i in range(2)]  # after the reset
    broken = ("visible-devices-one-short", "holder-always-free", "healed-never-listed", "devices-file-leaks")
    soak = soak_of(cluster, namespace, tmp_path, steps, {}, broken=broken, settle_s=BOUND_S + 5)
    path = run(soak, log_dir)
    shown = violations(soak, "devices match")
    assert {what.split(":")[0] for what in shown} == {"selftest-0", "selftest-1"}, path
    assert all("allocation names chips [0, 1]" in what or "allocation names chips [2, 3]" in what for what in shown)
    reset = violations(soak, "no reset under a holder")
    assert reset and reset[0].startswith("chip 0 reset at") and "held by {'selftest-" in reset[0], path
    back = violations(soak, "back in service")
    assert back and "allocatable 1 < 2 for the chips healthy since 30 s+" in back[0], path
    assert "allocatable 1 at the end, not 2" in back[-1], path
    bounded = violations(soak, "bounded")
    assert bounded and int(bounded[0].split("open files ")[1].split(" ")[0]) > MAX_OPEN_FILES, path


def test_the_soak_catches_a_dra_driver_that_leaves_a_claims_cdi_spec(
    cluster: Cluster, namespace: str, log_dir: Path, tmp_path: Path, clean_node: None, project_image: BuiltImage
) -> None:
    """The DRA driver's unprepare forgets the claim but leaves its CDI spec file (breaks.py): once the pod and its
    claim are gone, "nothing left" reports the spec, with the driver running and again once it is stopped."""
    steps = [Step(3.0, "pod-create", (), 0.0, {"pod": "selftest-claim", "shape": "claim-1"})]
    steps += [Step(15.0, "pod-delete", (), 0.0, {"pod": "selftest-claim"})]
    soak = soak_of(cluster, namespace, tmp_path, steps, {}, mode="dra", broken=("claim-spec-left",), settle_s=BOUND_S)
    try:
        path = run(soak, log_dir)
    finally:  # what the broken build left is no later scenario's leftover
        for spec in cluster.cdi_dir.glob(f"{CDI_PREFIX}*"):
            spec.unlink()
    assert not soak.held, path  # the pod and its claim were gone before the end's look
    left = violations(soak, "nothing left")
    assert len(left) == 2 and all(CDI_PREFIX in what for what in left), path
