"""Both DaemonSets as the chart installs them by default: unprivileged, with the NRI injector sidecar giving the
agent's own container the node's GPU device nodes through containerd's NRI socket. The simulated backend opens
those nodes (real character devices on the host, major 508) as IXML does, so the container's device cgroup decides:
with the injected rules the open reaches the kernel (ENXIO: no driver behind the major), without them it is refused
(EPERM). Served: capacity, Allocate (a pod gets its chips), prepare (a DRA claim), health and XIDs; the node is
labelled iluvatar.com/gpu.device-access=nri.

Neither container reaches the host's terminals or shared memory (harness/hostdev.py): the host's /dev they mount
has empty folders over its pts and shm; a pod that mounts the host's /dev without them is caught by the same checks.

Negative control: the same chart with the injector off, no privilege and no privileged fallback (deviceInjection=
runtime on a runtime that gives nothing, strict=true): the agent logs the one line naming the fix, advertises
nothing, labels its node `none` and says so in one Node Event, running (not restarting, not waiting in Init).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from harness.cluster import Cluster
from harness.dra import DRA_VALUES, claim, driver_slices, minor_is, node_slice
from harness.hostdev import container_pid, host_probe, seen_from_inside, seen_through_root
from harness.kube import Kubectl, KubectlError, Obj
from harness.plugin import devices_yaml, write_atomically
from harness.pods import SHOW_DEVICES, STAY, busybox_pod, node_resource, phase_is, run_and_read, shown_devices, wait_pod
from harness.project_image import BuiltImage
from harness.release import (
    CHIPS,
    DRA_DRIVER,
    INJECTOR,
    NAMESPACE,
    PLUGIN,
    access_events,
    agent_pod,
    assert_unprivileged_as_run,
    in_init,
    installed,
    kubelet_log,
    node_label,
    running_pod,
)
from harness.waits import until

RESOURCE = "iluvatar.com/gpu"
OUT = CHIPS[3]  # gets an XID 64 (it needs an operator: no reset races the check)
ACCESS_LINE = "cannot open /dev/iluvatar0 (Operation not permitted): no GPU access here"


def assert_no_host_terminal_or_shared_memory(cluster: Cluster, admin: Kubectl, pod: Obj, agent: str) -> None:
    """From both containers of the agent's pod as the chart runs it: no host pty opens, no host shared memory is
    seen, and what the agent writes to its /dev/shm stays its own."""
    with host_probe() as probe:
        for container, dev in ((agent, "/dev"), (INJECTOR, "/host/dev")):
            assert seen_through_root(container_pid(cluster, pod, container), dev, probe) == [], container
        assert seen_from_inside(admin, NAMESPACE, pod["metadata"]["name"], agent, "/dev", probe) == []


def test_the_host_dev_checks_catch_a_container_that_mounts_the_hosts_dev_as_it_is(
    cluster: Cluster, admin: Kubectl, namespace: str
) -> None:
    """The negative control of the checks above: a pod mounting the host's /dev read-only, as the agent's sidecar did
    before its pts and shm were hidden, reaches both."""
    pod = busybox_pod("host-dev", STAY)
    pod["spec"]["volumes"] = [{"name": "dev", "hostPath": {"path": "/dev", "type": "Directory"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "dev", "mountPath": "/host/dev", "readOnly": True}]
    admin.create(pod, "-n", namespace)
    running = wait_pod(admin, namespace, "host-dev", phase_is("Running"), "running", 120)
    with host_probe() as probe:
        through_root = seen_through_root(container_pid(cluster, running, "main"), "/host/dev", probe)
        wanted = ["the host's pty, opened read-write)", "the host's shared memory)"]
        assert [line.split(" (")[1] for line in through_root] == wanted, through_root
        inside = seen_from_inside(admin, namespace, "host-dev", "main", "/host/dev", probe)
        assert len(inside) == 2 and "opened read-write from inside" in inside[0] and "on the host" in inside[1], inside


def test_the_device_plugin_daemonset_runs_unprivileged_and_serves(
    cluster: Cluster, admin: Kubectl, namespace: str, project_image: BuiltImage, tmp_path: Path
) -> None:
    with installed(cluster, tmp_path, {}) as release:
        devices = release.devices
        pod = running_pod(cluster, PLUGIN)
        assert_unprivileged_as_run(admin, pod, PLUGIN)
        assert_no_host_terminal_or_shared_memory(cluster, admin, pod, PLUGIN)
        until(lambda: node_label(admin, cluster.node_name) == "nri", 60, "the node labelled nri", [])
        until(
            lambda: node_resource(admin, cluster.node_name, RESOURCE) == (4, 4),
            60,
            f"{RESOURCE}: 4 (split chips) from the unprivileged plugin",
            kubelet_log(cluster),
        )
        _, output = run_and_read(admin, namespace, busybox_pod("allocated", SHOW_DEVICES + STAY, gpus=1))
        nodes, env = shown_devices(output)
        (minor,) = [int(p.removeprefix("/dev/iluvatar")) for p in nodes if p.startswith("/dev/iluvatar")]
        assert env["IX_VISIBLE_DEVICES"] and "/dev/itrctl" in nodes and minor in range(4)
        write_atomically(devices, devices_yaml([replace(OUT, xids=(64,)) if c == OUT else c for c in CHIPS]))
        until(
            lambda: node_resource(admin, cluster.node_name, RESOURCE) == (4, 3),
            60,
            f"{RESOURCE}: 3 of 4 after an XID 64",
            kubelet_log(cluster),
        )
        until(  # a Node Event written with the pod's own token
            lambda: f"GPU {OUT.minor} ({OUT.uuid}): XID 64" in admin("describe", "node", cluster.node_name),
            60,
            "the XID as a Node Event",
            [],
        )
        assert agent_pod(admin, PLUGIN)["status"]["containerStatuses"][0]["restartCount"] == 0


def test_the_dra_driver_daemonset_runs_unprivileged_and_prepares_a_claim(
    cluster: Cluster, admin: Kubectl, namespace: str, project_image: BuiltImage, tmp_path: Path
) -> None:
    with installed(cluster, tmp_path, DRA_VALUES) as release:
        devices = release.devices
        pod = running_pod(cluster, DRA_DRIVER)
        assert_unprivileged_as_run(admin, pod, DRA_DRIVER)
        assert_no_host_terminal_or_shared_memory(cluster, admin, pod, DRA_DRIVER)
        until(lambda: node_label(admin, cluster.node_name) == "nri", 60, "the node labelled nri", [])

        def published() -> list[Obj]:
            with contextlib.suppress(AssertionError, KeyError, ValueError):
                return node_slice(cluster)["spec"]["devices"]
            return []

        chips = {f"gpu-{c.minor}" for c in CHIPS}
        until(lambda: chips <= {d["name"] for d in published()}, 90, "the 4 chips published", [])
        admin.create([claim("one", selector=minor_is(1))], "-n", namespace)
        holder = busybox_pod("prepared", SHOW_DEVICES + STAY, claims=[{"name": "gpu", "resourceClaimName": "one"}])
        _, output = run_and_read(admin, namespace, holder)
        nodes, _ = shown_devices(output)
        assert f"/dev/iluvatar{CHIPS[1].minor}" in nodes and "/dev/itrctl" in nodes
        write_atomically(devices, devices_yaml([replace(OUT, xids=(64,)) if c == OUT else c for c in CHIPS]))

        def tainted() -> list[Any]:
            return next((d.get("taints") or [] for d in published() if d["name"] == f"gpu-{OUT.minor}"), [])

        until(tainted, 60, f"gpu-{OUT.minor} tainted after an XID 64", [])
        admin.delete("pod", "prepared", namespace)
        admin.delete("resourceclaim", "one", namespace)


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
def test_without_device_access_in_strict_mode_the_agent_says_so_once_and_advertises_nothing(
    cluster: Cluster, admin: Kubectl, project_image: BuiltImage, tmp_path: Path, mode: str
) -> None:
    # No sidecar, no privilege, no privileged fallback: nothing gives the nodes.
    overrides: dict[str, Any] = {"deviceInjection": "runtime", "strict": True}
    name = PLUGIN if mode == "device-plugin" else DRA_DRIVER
    if mode == "dra":
        overrides.update(DRA_VALUES)
    before = access_events(admin, cluster.node_name)
    with installed(cluster, tmp_path, overrides):

        def said() -> str | None:
            pod = agent_pod(admin, name)
            if pod is None:
                return None
            for previous in ([], ["--previous"]):
                with contextlib.suppress(KubectlError):
                    logs = admin("logs", pod["metadata"]["name"], "-n", NAMESPACE, "-c", name, *previous)
                    lines = [line for line in logs.splitlines() if ACCESS_LINE in line]
                    if lines:
                        return "\n".join(lines)
            return None

        line = until(said, 180, "the agent's one line about device access", kubelet_log(cluster), interval=2)
        assert "deviceInjection=nri" in line and "privileged=true" in line, line
        assert "strict mode forbids the privileged fallback" in line, line
        until(lambda: node_label(admin, cluster.node_name) == "none", 60, "the node labelled none", [])
        (event,) = until(
            lambda: access_events(admin, cluster.node_name, not_in=before),
            60,
            "one GPUDeviceAccessMissing Event on the Node",
            [],
        )
        assert event["type"] == "Warning" and ACCESS_LINE in event["message"]
        pod = agent_pod(admin, name)
        assert pod is not None and "initContainers" not in pod["spec"]
        assert pod["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["status"]["phase"] == "Running" and in_init(admin) == []
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0  # up, not restarting
        if mode == "device-plugin":
            assert node_resource(admin, cluster.node_name, RESOURCE)[1] == 0
        else:
            assert [s for s in driver_slices(admin) if s["spec"].get("devices")] == []
