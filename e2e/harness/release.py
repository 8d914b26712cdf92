"""The chart installed on the test node as a user installs it, and what the scenarios read of its pods.

`installed` is `helm install` with the chart's values but for the node's paths (harness/helm.py node_values), over 4
split chips in a simulated devices file; on leaving, the release is uninstalled and every node label the agent or
the test set is removed, so that the next scenario starts from a node as a user's would be.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cluster import Cluster
from .dra import delete_slices
from .helm import CHART, Helm, node_values
from .kube import Kubectl, Obj
from .plugin import DEVICE_MAJOR, bi_v150_chips, devices_yaml, node_events
from .waits import WaitFailed, until

NAMESPACE = "kube-system"
RELEASE = "ix-device-plugin"
GPU_LABEL = "iluvatar.com/gpu.present"
DRA_LABEL = "iluvatar.com/gpu.dra"
ACCESS_LABEL = "iluvatar.com/gpu.device-access"
PLUGIN = "iluvatar-device-plugin"
DRA_DRIVER = "iluvatar-dra-driver"
FALLBACK_SUFFIX = "-privileged"  # the privileged DaemonSet's name and pods' name label: <main>-privileged
CHIPS = bi_v150_chips()
INJECTOR = "nri-injector"
RESET_HELPER = "reset-helper"
# The open from inside the agent's container: EPERM where the device cgroup refuses, ENXIO where it lets it through.
AGENTS = (PLUGIN, PLUGIN + FALLBACK_SUFFIX, DRA_DRIVER, DRA_DRIVER + FALLBACK_SUFFIX)  # their pods' name labels
GONE_S = 120.0  # an agent's pods stop within their grace period (30 s), the kubelet's clean-up after
TRY_OPEN = "import os\ntry:\n    os.open('/dev/iluvatar0', os.O_RDWR)\nexcept OSError as e:\n    print(e.strerror)\n"


@dataclass(frozen=True)
class Installed:
    """A release on the node: its helm, the values it was installed with, and the simulated devices file."""

    helm: Helm
    values: dict[str, Any]
    devices: Path


@contextlib.contextmanager
def installed(
    cluster: Cluster, workdir: Path, overrides: dict[str, Any], chart: Path = CHART, release: str = RELEASE
) -> Iterator[Installed]:
    """`helm install` of chart with overrides over 4 split chips (a simulated devices file), node-health record and
    DRA state in a folder of the test's own; uninstalled after, node labels removed."""
    helm = Helm(cluster.binaries["helm"], workdir, cluster.kubeconfig("admin"))
    corex = workdir / "corex"
    corex.mkdir(exist_ok=True)
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
    agents_gone(cluster)
    cluster.admin("label", "node", cluster.node_name, label, "--overwrite")
    helm("install", release, str(chart), "--namespace", NAMESPACE, "--values", str(helm.values_file(values)))
    try:
        yield Installed(helm, values, devices)
    finally:
        uninstall(cluster, helm, release)
        forget_node_labels(cluster, label.split("=")[0])
        if dra:
            delete_slices(cluster.admin)
        shutil.rmtree(plugins, ignore_errors=True)


def uninstall(cluster: Cluster, helm: Helm, release: str = RELEASE) -> None:
    """`helm uninstall --wait`, and then until the release's pods are gone: helm waits for its objects only, and a
    pod still terminating would be a second pod of the DaemonSet the next scenario installs."""
    helm("uninstall", release, "--namespace", NAMESPACE, "--wait", "--timeout", "90s")
    agents_gone(cluster)


def agents_gone(cluster: Cluster, timeout: float = GONE_S) -> None:
    """Until no pod of an agent's DaemonSet is on the node (an earlier scenario's, terminating); a failure names them,
    with their phase and since when they terminate, and the kubelet's and containerd's logs."""
    left: list[str] = []

    def gone() -> bool:
        left[:] = shown(cluster.admin.items("pods", NAMESPACE, "-l", f"app.kubernetes.io/name in ({','.join(AGENTS)})"))
        return not left

    try:
        until(gone, timeout, "no agent pod left on the node", kubelet_log(cluster), interval=1)
    except WaitFailed as failed:
        raise WaitFailed(f"{failed}\nstill there: {'; '.join(left)}") from None


def shown(pods: list[Obj]) -> list[str]:
    """Each pod as its name, phase, Ready and since when it terminates."""
    lines = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status", {})
        deleting = f", terminating since {meta['deletionTimestamp']}" if meta.get("deletionTimestamp") else ""
        lines.append(f"{meta['name']} ({status.get('phase', '?')}, Ready {ready(pod)}{deleting})")
    return lines


def forget_node_labels(cluster: Cluster, *labels: str) -> None:
    """The node without these labels and without the agent's device-access label (which outlives the agent)."""
    cluster.admin("label", "node", cluster.node_name, *(f"{name}-" for name in (*labels, ACCESS_LABEL)))


def agent_pods(admin: Kubectl, name: str) -> list[Obj]:
    """The pods of the DaemonSet whose pods carry app.kubernetes.io/name=name."""
    return admin.items("pods", NAMESPACE, "-l", f"app.kubernetes.io/name={name}")


def agent_pod(admin: Kubectl, name: str) -> Obj | None:
    pods = agent_pods(admin, name)
    return pods[0] if len(pods) == 1 else None


def ready(pod: Obj | None) -> bool:
    conditions = {c["type"]: c["status"] for c in (pod or {}).get("status", {}).get("conditions", [])}
    return conditions.get("Ready") == "True"


def running_pod(cluster: Cluster, name: str, timeout: float = 240, what: str = "") -> Obj:
    """The one pod of name's DaemonSet once Ready (behind its injector sidecar, where it has one); a failure names the
    pods seen last (none, or more than one) and `what` was awaited (default: the pod Ready)."""
    seen: list[str] = []

    def found() -> Obj | None:
        pods = agent_pods(cluster.admin, name)
        seen[:] = shown(pods)
        return pods[0] if len(pods) == 1 and ready(pods[0]) else None

    try:
        return until(found, timeout, what or f"the {name} pod Ready", kubelet_log(cluster), interval=2)
    except WaitFailed as failed:
        raise WaitFailed(f"{failed}\npods: {'; '.join(seen) or 'none'}") from None


def kubelet_log(cluster: Cluster) -> list[Path]:
    return [cluster.processes["kubelet"].log, cluster.processes["containerd"].log]


def node_label(admin: Kubectl, node: str, label: str = ACCESS_LABEL) -> str | None:
    labels = admin.get_or_none("node", node) or {}
    return (labels.get("metadata", {}).get("labels") or {}).get(label)


def access_events(admin: Kubectl, node: str, not_in: Iterable[Obj] = ()) -> list[Obj]:
    """The agent's GPUDeviceAccessMissing Events on the Node, but those of not_in (seen before a scenario: Events
    outlive the pods that wrote them)."""
    before = {event["metadata"]["name"] for event in not_in}
    found = [e for e in node_events(admin, node) if e["reason"] == "GPUDeviceAccessMissing"]
    return [e for e in found if e["metadata"]["name"] not in before]


def in_init(admin: Kubectl) -> list[str]:
    """The agent's pods waiting in an init phase: what a node must never show."""
    stuck = []
    for pod in admin.items("pods", NAMESPACE):
        status = pod.get("status", {})
        waiting = [s for s in status.get("initContainerStatuses", []) if "waiting" in s.get("state", {})]
        if waiting and status.get("phase") == "Pending":
            stuck.append(f"{pod['metadata']['name']}: {waiting[0]['state']['waiting'].get('reason', '?')}")
    return stuck


def assert_unprivileged_as_run(admin: Kubectl, pod: Obj, container: str) -> None:
    """The pod as the kubelet ran it: the agent unprivileged, the injector a native sidecar that gave it its nodes;
    and from inside the agent's container, no capability, no new privileges, seccomp filtering, and the device
    cgroup letting /dev/iluvatar0 through."""
    spec = pod["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    agent = containers.pop(container)
    assert set(containers) <= {RESET_HELPER}, containers  # the reset helper beside it, privileged, holds no token
    for helper in containers.values():
        assert helper["securityContext"]["privileged"] is True and not helper.get("ports")
        assert not any("serviceaccount" in m["mountPath"] for m in helper.get("volumeMounts", [])), helper
    (injector,) = spec["initContainers"]
    assert injector["name"] == INJECTOR and injector["restartPolicy"] == "Always"
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
