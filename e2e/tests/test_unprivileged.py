"""Both DaemonSets as the chart installs them by default: unprivileged, with the NRI injector sidecar giving the
agent's own container the node's GPU device nodes through containerd's NRI socket. The simulated backend opens
those nodes (real character devices on the host, major 508) as IXML does, so the container's device cgroup decides:
with the injected rules the open reaches the kernel (ENXIO: no driver behind the major), without them it is refused
(EPERM). Served: capacity, Allocate (a pod gets its chips), prepare (a DRA claim), health and XIDs.

Negative control: the same chart with the injector off and no privilege (deviceInjection=runtime on a runtime that
gives nothing): the agent logs the one line naming the fix and advertises nothing.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from harness.cluster import Cluster
from harness.dra import DRA_VALUES, claim, delete_slices, driver_slices, minor_is, node_slice
from harness.helm import CHART, Helm, node_values
from harness.kube import Kubectl, KubectlError, Obj
from harness.plugin import DEVICE_MAJOR, bi_v150_chips, devices_yaml, write_atomically
from harness.pods import SHOW_DEVICES, STAY, busybox_pod, node_resource, run_and_read, shown_devices
from harness.project_image import BuiltImage
from harness.waits import until

RESOURCE = "iluvatar.com/gpu"
NAMESPACE = "kube-system"
RELEASE = "ix-device-plugin"
GPU_LABEL = "iluvatar.com/gpu.present"
DRA_LABEL = "iluvatar.com/gpu.dra"
PLUGIN = "iluvatar-device-plugin"
DRA_DRIVER = "iluvatar-dra-driver"
INJECTOR = "nri-injector"
CHIPS = bi_v150_chips()
OUT = CHIPS[3]  # gets an XID 64 (it needs an operator: no reset races the check)
ACCESS_LINE = "cannot open /dev/iluvatar0 (Operation not permitted): no GPU access here"
# The open from inside the agent's container: EPERM where the device cgroup refuses, ENXIO where it lets it through.
TRY_OPEN = "import os\ntry:\n    os.open('/dev/iluvatar0', os.O_RDWR)\nexcept OSError as e:\n    print(e.strerror)\n"


@contextlib.contextmanager
def installed(cluster: Cluster, workdir: Path, overrides: dict[str, Any]) -> Iterator[Path]:
    """`helm install` of the chart with overrides over 4 split chips (a simulated devices file, the path yielded),
    node-health record and DRA state in a folder of the test's own; uninstalled after."""
    helm = Helm(cluster.binaries["helm"], workdir, cluster.kubeconfig("admin"))
    corex = workdir / "corex"
    corex.mkdir()
    devices = corex / "devices.yaml"
    devices.write_text(devices_yaml(CHIPS))
    # Short: the DRA socket under it (gpu.iluvatar.com/dra-<tag>.sock) must fit a unix socket's 107 bytes.
    plugins = Path(tempfile.mkdtemp(prefix="ix-kp-"))
    dra = overrides.get("dra", {}).get("enabled", False)
    # The DRA driver mounts corexPath at /usr/local/corex; the device plugin at the same path.
    devices_in_pod = "/usr/local/corex/devices.yaml" if dra else str(devices)
    values = {**node_values(cluster, workdir, plugins, simulated_devices=devices_in_pod), **overrides}
    if dra:
        values["dra"] = {
            **values["dra"],
            "kubeletRegistrarDirectoryPath": str(cluster.plugins_registry_dir),
            "kubeletPluginsDirectoryPath": str(plugins),
        }
    label = f"{DRA_LABEL}=true" if dra else f"{GPU_LABEL}=true"
    cluster.admin("label", "node", cluster.node_name, label, "--overwrite")
    helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(helm.values_file(values)))
    try:
        yield devices
    finally:
        helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "90s")
        cluster.admin("label", "node", cluster.node_name, f"{label.split('=')[0]}-")
        if dra:
            delete_slices(cluster.admin)
        shutil.rmtree(plugins, ignore_errors=True)


def kubelet_log(cluster: Cluster) -> list[Path]:
    return [cluster.processes["kubelet"].log, cluster.processes["containerd"].log]


def agent_pod(admin: Kubectl, name: str) -> Obj | None:
    pods = admin.items("pods", NAMESPACE, "-l", f"app.kubernetes.io/name={name}")
    return pods[0] if len(pods) == 1 else None


def ready(pod: Obj | None) -> bool:
    conditions = {c["type"]: c["status"] for c in (pod or {}).get("status", {}).get("conditions", [])}
    return conditions.get("Ready") == "True"


def running_pod(cluster: Cluster, name: str) -> Obj:
    return until(
        lambda: (found := agent_pod(cluster.admin, name)) and ready(found) and found,
        240,
        f"the {name} pod Ready behind its injector sidecar",
        kubelet_log(cluster),
        interval=2,
    )


def assert_unprivileged_as_run(admin: Kubectl, pod: Obj, container: str) -> None:
    """The pod as the kubelet ran it: the agent unprivileged, the injector a native sidecar that gave it its nodes;
    and from inside the agent's container, no capability, no new privileges, seccomp filtering, and the device
    cgroup letting /dev/iluvatar0 through."""
    spec = pod["spec"]
    (agent,) = spec["containers"]
    (injector,) = spec["initContainers"]
    assert agent["name"] == container and injector["name"] == INJECTOR and injector["restartPolicy"] == "Always"
    for context in (agent["securityContext"], injector["securityContext"]):
        assert not context.get("privileged") and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
    name = pod["metadata"]["name"]
    status = dict(
        line.split(":\t", 1)
        for line in admin("exec", name, "-n", NAMESPACE, "-c", container, "--", "cat", "/proc/1/status").splitlines()
        if ":\t" in line
    )
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2", status
    opened = admin("exec", name, "-n", NAMESPACE, "-c", container, "--", "python3", "-c", TRY_OPEN).strip()
    assert opened == "No such device or address", opened  # through the cgroup, to a major no driver serves
    logs = admin("logs", name, "-n", NAMESPACE, "-c", INJECTOR)
    given = [line for line in logs.splitlines() if f"gave {NAMESPACE}/{name} container {container}" in line]
    assert len(given) == 1, logs
    for chip in CHIPS:
        assert f"/dev/iluvatar{chip.minor} (c {DEVICE_MAJOR}:{chip.minor} rw)" in given[0], given[0]
    assert "/dev/itrctl (c " in given[0]


def test_the_device_plugin_daemonset_runs_unprivileged_and_serves(
    cluster: Cluster, admin: Kubectl, namespace: str, project_image: BuiltImage, tmp_path: Path
) -> None:
    with installed(cluster, tmp_path, {}) as devices:
        pod = running_pod(cluster, PLUGIN)
        assert_unprivileged_as_run(admin, pod, PLUGIN)
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
    with installed(cluster, tmp_path, DRA_VALUES) as devices:
        pod = running_pod(cluster, DRA_DRIVER)
        assert_unprivileged_as_run(admin, pod, DRA_DRIVER)

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
def test_without_device_access_the_agent_says_so_in_one_line_and_advertises_nothing(
    cluster: Cluster, admin: Kubectl, project_image: BuiltImage, tmp_path: Path, mode: str
) -> None:
    overrides: dict[str, Any] = {"deviceInjection": "runtime"}  # no sidecar, no privilege: nothing gives the nodes
    name = PLUGIN if mode == "device-plugin" else DRA_DRIVER
    if mode == "dra":
        overrides.update(DRA_VALUES)
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
        pod = agent_pod(admin, name)
        assert pod is not None and "initContainers" not in pod["spec"]
        assert pod["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert not ready(pod)
        if mode == "device-plugin":
            assert node_resource(admin, cluster.node_name, RESOURCE)[1] == 0
        else:
            assert [s for s in driver_slices(admin) if s["spec"].get("devices")] == []
