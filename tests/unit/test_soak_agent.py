"""The soak's agent kill (e2e/soak/agent.py): a container a rollout stopped between the soak's look at the pod and
its kill is waited for as a killed one, not taken for a failure of the soak; a kill that fails on a running container
still fails."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.soak_modules import SoakStandIn, load

CONTAINER = "0841ca24024b0323ede1d21f700649f0644126250b8f02b6fecbf251c3d2c126"
TTRPC_CLOSED = f"ctr tasks kill --signal SIGKILL {CONTAINER}: exit code 1\nstderr:\nctr: ttrpc: closed"


class Containerd:
    """ctr as the soak calls it: the kill refused, the tasks listed as `tasks ls` prints them."""

    def __init__(self, tasks: str) -> None:
        self.tasks = tasks

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        if args[:2] == ("tasks", "kill"):
            raise AssertionError(TTRPC_CLOSED)
        assert args == ("tasks", "ls") and not check
        return subprocess.CompletedProcess(["ctr", *args], 0, stdout=self.tasks, stderr="")


def killing(tmp_path: Path, tasks: str) -> tuple[object, list[str]]:
    SoakStandIn(tmp_path / "hardware", pid=100)  # the e2e harness on the path, as the soak has it
    containerd = Containerd(tasks)
    kubeconfig = lambda who: tmp_path / who  # noqa: E731
    cluster = SimpleNamespace(binaries={"helm": Path("helm")}, kubeconfig=kubeconfig, ctr=containerd.ctr)
    agent = load("agent").Agent(cluster, "device-plugin", tmp_path, SimpleNamespace())
    running = {"state": {"running": {}}, "containerID": f"containerd://{CONTAINER}"}
    pod = {"metadata": {"name": "p"}, "status": {"containerStatuses": [running]}}
    waited: list[str] = []
    agent.newest = lambda: pod
    agent.wait_settled = lambda other_than="", timeout=0: waited.append(other_than)
    return agent, waited


def test_a_container_stopped_before_the_kill_reached_it_is_waited_for_as_a_killed_one(tmp_path: Path) -> None:
    """Seed 996303 (device plugin): the kill came 0.4 s after a rollout's kubelet stopped the container, its pod
    still running in the API; ctr failed ("ttrpc: closed") and the soak ended at 76 s."""
    agent, waited = killing(tmp_path, "TASK    PID    STATUS\nother   12     RUNNING\n")
    how = agent.kill()
    assert "stopped before the kill reached it" in how and waited == [CONTAINER] and agent.starts == 1


def test_a_kill_that_fails_on_a_running_container_fails(tmp_path: Path) -> None:
    agent, waited = killing(tmp_path, f"TASK    PID    STATUS\n{CONTAINER}    4242    RUNNING\n")
    with pytest.raises(AssertionError, match="ttrpc: closed"):
        agent.kill()
    assert waited == []
