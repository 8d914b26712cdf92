"""Self-healing on the node as the chart installs it by default, in both modes: the agent unprivileged, its GPU
resets run by the privileged reset helper beside it (resetHelper), with an ixsmi stand-in as strict as CoreX's (it
refuses without privilege: harness/resets.py).

- XID 48 on a free chip: reset through the helper, proven (enumerated again at its address, the XID not reported
  again), back in service.
- Strict mode (nothing privileged, no helper): the chip stays out with one GPUResetUnavailable Event naming what is
  missing, and no ixsmi run and no handshake with other IXML users (no ConfigMap ix-gpu-reset-<node>).
- A lying ixsmi (it exits 0, the chip is not reset: the devices file's `reset: {lie: [...]}` reports its XID again):
  the attempt fails, the chip stays out.
- The reset limit: a chip faulting once more than health.resetLimit within the window stays out with
  GPUResetLimitReached, across a restart of the agent's pod.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from harness.cluster import Cluster
from harness.dra import DRA_VALUES, node_slice
from harness.kube import Kubectl
from harness.plugin import Chip, node_events, write_atomically
from harness.pods import node_resource
from harness.project_image import BuiltImage
from harness.release import CHIPS, DRA_DRIVER, NAMESPACE, PLUGIN, RESET_HELPER, agent_pod, installed, kubelet_log
from harness.release import running_pod as ready_pod
from harness.resets import ResetLog, devices_with, new_events
from harness.waits import stays, until

RESOURCE = "iluvatar.com/gpu"
BROKEN = CHIPS[3]  # no pod ever asks for it: free


def _mode_values(mode: str, log: ResetLog, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    values: dict[str, Any] = {**log.values(), **(extra or {})}
    if mode == "dra":
        values.update(DRA_VALUES)
    return values


def _agent(mode: str) -> str:
    return PLUGIN if mode == "device-plugin" else DRA_DRIVER


def _in_service(cluster: Cluster, mode: str, chip: Chip) -> bool | None:
    """Whether chip is served (device plugin: allocatable 4 of 4; DRA: its device published untainted)."""
    if mode == "device-plugin":
        return node_resource(cluster.admin, cluster.node_name, RESOURCE) == (4, 4)
    with contextlib.suppress(AssertionError, KeyError, ValueError):
        devices = {d["name"]: d for d in node_slice(cluster)["spec"]["devices"]}
        device = devices.get(f"gpu-{chip.minor}")
        return device is not None and not device.get("taints")
    return None


def _out(cluster: Cluster, mode: str, chip: Chip) -> bool:
    return _in_service(cluster, mode, chip) is False


def _handshake(admin: Kubectl, cluster: Cluster) -> tuple[str, str] | None:
    """The reset handshake's ConfigMap (ix-gpu-reset-<node>) as (resourceVersion, its document); None: none."""
    found = admin.get_or_none("configmap", f"ix-gpu-reset-{cluster.node_name}", NAMESPACE)
    if found is None:
        return None
    document = found.get("data", {}).get("gpuReset", "")
    assert "reset: true" not in document, document
    return found["metadata"]["resourceVersion"], document


def _break(devices: Path, xids: tuple[int, ...], reset: dict[str, list[str]] | None = None) -> None:
    chips = [replace(c, xids=xids) if c == BROKEN else c for c in CHIPS]
    write_atomically(devices, devices_with(chips, reset))


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
def test_an_xid_48_on_a_free_chip_is_reset_by_the_helper_proven_and_back_in_service(
    cluster: Cluster, admin: Kubectl, project_image: BuiltImage, tmp_path: Path, mode: str
) -> None:
    log = ResetLog(tmp_path)
    before = node_events(admin, cluster.node_name)
    with installed(cluster, tmp_path, _mode_values(mode, log)) as release:
        pod = ready_pod(cluster, _agent(mode))
        assert RESET_HELPER in {c["name"] for c in pod["spec"]["containers"]}
        until(lambda: _in_service(cluster, mode, BROKEN), 90, "every chip in service", kubelet_log(cluster))
        _break(release.devices, (48,))
        (healthy,) = until(
            lambda: new_events(admin, cluster.node_name, "GPUHealthy", BROKEN, before),
            120,
            f"{BROKEN.uuid} back in service after its reset",
            kubelet_log(cluster),
            interval=1,
        )
        assert "after a reset" in healthy["message"], healthy
        assert log.runs() == [f"ran -r -i {BROKEN.uuid}"], log.runs()  # run by the privileged helper, once
        until(lambda: _in_service(cluster, mode, BROKEN), 60, "the chip served again", [])
        assert new_events(admin, cluster.node_name, "GPUHealingFailed", BROKEN, before) == []


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
def test_in_strict_mode_the_chip_stays_out_with_one_event_and_no_ixsmi_run_or_handshake(
    cluster: Cluster, admin: Kubectl, project_image: BuiltImage, tmp_path: Path, mode: str
) -> None:
    log = ResetLog(tmp_path)
    before = node_events(admin, cluster.node_name)
    with installed(cluster, tmp_path, _mode_values(mode, log, {"strict": True})) as release:
        pod = ready_pod(cluster, _agent(mode))
        assert [c["name"] for c in pod["spec"]["containers"]] == [_agent(mode)]  # no helper: nothing privileged
        until(lambda: _in_service(cluster, mode, BROKEN), 90, "every chip in service", kubelet_log(cluster))
        handshake = _handshake(admin, cluster)  # the driver may say at start that it holds the GPUs (reset: false)
        _break(release.devices, (48,))
        (event,) = until(
            lambda: new_events(admin, cluster.node_name, "GPUResetUnavailable", BROKEN, before),
            60,
            "one GPUResetUnavailable Event",
            kubelet_log(cluster),
            interval=1,
        )
        assert event["type"] == "Warning" and "strict" in event["message"], event
        assert "ixsmi -r -i" in event["message"] and "iluvatar.com/gpu.return" in event["message"], event
        until(lambda: _out(cluster, mode, BROKEN), 30, "the chip out of service", [])  # the node's status lags
        stays(lambda: _out(cluster, mode, BROKEN), 8, "the chip out of service")
        assert len(new_events(admin, cluster.node_name, "GPUResetUnavailable", BROKEN, before)) == 1
        for reason in ("GPUHealingReset", "GPUHealingFailed", "GPUNeedsOperator"):
            assert new_events(admin, cluster.node_name, reason, BROKEN, before) == [], reason
        assert log.runs() == []
        if mode == "dra":  # what is done about it, on the device itself
            devices = {d["name"]: d for d in node_slice(cluster)["spec"]["devices"]}
            taints = {t["key"]: t.get("value") for t in devices[f"gpu-{BROKEN.minor}"]["taints"]}
            assert taints.get("gpu.iluvatar.com/healing") == "reset-unavailable", taints
        assert _handshake(admin, cluster) == handshake  # no one was asked to let go: not written since


def test_a_lying_ixsmi_leaves_the_chip_out_of_service(
    cluster: Cluster, admin: Kubectl, project_image: BuiltImage, tmp_path: Path
) -> None:
    log = ResetLog(tmp_path)
    before = node_events(admin, cluster.node_name)
    with installed(cluster, tmp_path, log.values()) as release:
        ready_pod(cluster, PLUGIN)
        until(lambda: _in_service(cluster, "device-plugin", BROKEN), 90, "every chip in service", kubelet_log(cluster))
        _break(release.devices, (48,), reset={"lie": [BROKEN.uuid]})  # ixsmi exits 0, the chip is not reset
        failed = until(
            lambda: new_events(admin, cluster.node_name, "GPUHealingFailed", BROKEN, before),
            120,
            "a failed attempt",
            kubelet_log(cluster),
            interval=1,
        )
        assert "XID 48 reported again after the reset" in failed[0]["message"], failed
        assert log.runs()[0] == f"ran -r -i {BROKEN.uuid}"
        stays(lambda: _out(cluster, "device-plugin", BROKEN), 5, "the chip out of service")
        assert new_events(admin, cluster.node_name, "GPUHealthy", BROKEN, before) == []


def test_a_chip_faulting_past_the_reset_limit_stays_out_across_a_restart_of_the_agent(
    cluster: Cluster, admin: Kubectl, project_image: BuiltImage, tmp_path: Path
) -> None:
    log = ResetLog(tmp_path)
    before = node_events(admin, cluster.node_name)
    limited = {"config": {"content": "flags:\n  splitboard: true\nhealth:\n  resetLimit: 1\n"}}
    with installed(cluster, tmp_path, {**log.values(), **limited}) as release:
        ready_pod(cluster, PLUGIN)
        until(lambda: _in_service(cluster, "device-plugin", BROKEN), 90, "every chip in service", kubelet_log(cluster))
        _break(release.devices, (48,))  # the first fault: healed
        until(lambda: new_events(admin, cluster.node_name, "GPUHealthy", BROKEN, before), 120, "healed once", [])
        _break(release.devices, (48, 46))  # the second, within the window: past the limit of 1
        (event,) = until(
            lambda: new_events(admin, cluster.node_name, "GPUResetLimitReached", BROKEN, before),
            60,
            "GPUResetLimitReached",
            kubelet_log(cluster),
            interval=1,
        )
        assert event["type"] == "Warning" and "iluvatar.com/gpu.return" in event["message"], event
        assert log.runs() == [f"ran -r -i {BROKEN.uuid}"]
        old = agent_pod(admin, PLUGIN)
        assert old is not None
        admin.delete("pod", old["metadata"]["name"], NAMESPACE)
        until(
            lambda: (pod := agent_pod(admin, PLUGIN)) is not None and pod["metadata"]["uid"] != old["metadata"]["uid"],
            120,
            "the agent's new pod",
            [],
        )
        ready_pod(cluster, PLUGIN)
        until(lambda: node_resource(admin, cluster.node_name, RESOURCE)[0] == 4, 60, "the new pod registered", [])
        stays(lambda: _out(cluster, "device-plugin", BROKEN), 8, "the chip still out after the restart")
        assert log.runs() == [f"ran -r -i {BROKEN.uuid}"]  # not reset again
