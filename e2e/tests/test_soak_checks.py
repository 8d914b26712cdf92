"""The chaos soak's check of the pods the kubelet failed, shown on the real node to catch a pod the agent refused at
admission (e2e/soak/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.project_image import BuiltImage
from soak import report
from soak.agent import Agent
from soak.faults import RETURN_ANNOTATION
from soak.hardware import Hardware
from soak.runner import Soak, stop
from soak.schedule import Step


@pytest.fixture
def clean_node(cluster: Cluster) -> Iterator[None]:
    cluster.admin("annotate", "node", cluster.node_name, f"{RETURN_ANNOTATION}-")
    yield
    cluster.admin("annotate", "node", cluster.node_name, f"{RETURN_ANNOTATION}-")


def soak_of(cluster: Cluster, namespace: str, tmp_path: Path, steps: list[Step], config: dict[str, object]) -> Soak:
    hardware = Hardware(tmp_path / "hardware")
    agent = Agent(cluster, "device-plugin", tmp_path / "agent", hardware)
    agent.base_config = config
    return Soak(cluster, namespace, "device-plugin", 0, steps, agent, hardware, settle_s=5)


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
