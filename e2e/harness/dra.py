"""The DRA driver as the end-to-end scenarios run it: `ix-device-plugin dra` as a host process, restartable with
other simulated boards and other ix-config flags; its ResourceSlices; ResourceClaims as the scenarios write
them; and what a container was given.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .cluster import Cluster
from .helm import Helm
from .kube import Kubectl, Obj, kubeconfig_text
from .plugin import DEVICE_MAJOR, Chip, PluginRun, bi_v150_chips, devices_yaml, start_dra_driver
from .pods import STAY, busybox_pod, shown_devices

DRIVER = "gpu.iluvatar.com"
OWN_SLICES = "app.kubernetes.io/managed-by=ix-device-plugin"
DRA_VALUES = {"dra": {"enabled": True}, "devicePlugin": {"enabled": False}}
EXTENDED_VALUES = {**DRA_VALUES, "dra": {"enabled": True, "extendedResourceName": "iluvatar.com/gpu"}}
CHIPS = bi_v150_chips()
BY_UUID = {chip.uuid: chip for chip in CHIPS}


def dra_chart_objects(cluster: Cluster, workdir: Path, values: dict[str, Any] | None = None) -> list[Obj]:
    """The chart's DRA objects (DeviceClasses, ServiceAccount, RBAC) as `helm template` renders them, no DaemonSet."""
    helm = Helm(cluster.binaries["helm"], workdir)
    return [obj for obj in helm.template(values or DRA_VALUES) if obj["kind"] != "DaemonSet"]


def pod_bound_kubeconfig(cluster: Cluster, namespace: str, service_account: str, pod: str, path: Path) -> Path:
    """A kubeconfig holding a token of the ServiceAccount bound to a pod of that ServiceAccount on the node, made
    here (it stays until deleted), as the DaemonSet's pod has one. The token names the node, which the API
    server's node-scoped checks need (writing a ResourceClaim's status.devices asks for `associated-node:patch`
    on `resourceclaims/driver`; a token with no node would need `arbitrary-node:patch`).
    """
    assert cluster.pki is not None
    manifest = busybox_pod(pod, STAY)
    manifest["metadata"]["namespace"] = namespace
    manifest["spec"].update(
        nodeName=cluster.node_name, serviceAccountName=service_account, automountServiceAccountToken=False
    )
    cluster.admin.create(manifest)
    uid = cluster.admin.get("pod", pod, namespace)["metadata"]["uid"]
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod}", f"--bound-object-uid={uid}"]
    token = cluster.admin("create", "token", service_account, "-n", namespace, *bound, "--duration=2h").strip()
    path.write_text(kubeconfig_text(cluster.server, cluster.pki.ca.cert, f"{namespace}-{service_account}", token=token))
    return path


def boards_yaml(boards: Sequence[dict[str, Any]]) -> str:
    """A simulated devices file of these boards (`{"product": "MR-V50"}`, chips numbered in order)."""
    return yaml.safe_dump({"boards": list(boards)}, sort_keys=False)


class Driver:
    """The running driver, restartable (the reboot scenario), with its chips changeable live and its
    configuration (simulated boards, flags such as `--replicas`) changeable by a restart.
    """

    def __init__(self, cluster: Cluster, workdir: Path, kubeconfig: Path) -> None:
        self.cluster, self.workdir, self.kubeconfig = cluster, workdir, kubeconfig
        self.run: PluginRun | None = None
        self.starts = 0
        self.devices: str | None = None  # the simulated devices file; None: the node's 2 x BI-V150 (CHIPS)
        self.flags: tuple[str, ...] = ()
        self.features: Path | None = None  # NFD's features.d; None: the workdir's

    def start(self, wait: bool = True) -> PluginRun:
        """Start the driver; with wait, until /readyz (registered with a running kubelet, slice published)."""
        self.starts += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "devices.yaml").write_text(self.devices if self.devices is not None else devices_yaml(CHIPS))
        name = f"{self.workdir.name}-{self.starts}"  # dra-driver0-1: the module's driver, its first start
        self.run = start_dra_driver(
            self.cluster, self.workdir, name, self.kubeconfig, extra=self.flags, features=self.features
        )
        if wait:
            self.run.wait_ready(90)
        return self.run

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()

    def configure(self, devices: str | None = None, flags: Sequence[str] = ()) -> PluginRun:
        """Running with these simulated devices and flags: when they differ from the running driver's, it is
        stopped, its slices deleted (a pool of another shape starts afresh) and started again, until ready.
        """
        running = self.run is not None and self.run.process.running()
        if running and self.run is not None and (devices, tuple(flags)) == (self.devices, self.flags):
            return self.run
        self.stop()
        delete_slices(self.cluster.admin)
        self.devices, self.flags = devices, tuple(flags)
        return self.start()

    def set_chips(self, chips: list[Chip]) -> None:
        assert self.run is not None
        self.run.set_chips(chips)

    @property
    def log(self) -> Path:
        assert self.run is not None
        return self.run.process.log


def delete_slices(admin: Kubectl) -> None:
    admin("delete", "resourceslice", "-l", OWN_SLICES, "--ignore-not-found", "--wait=true", timeout=90)


def driver_slices(admin: Kubectl) -> list[Obj]:
    """The driver's ResourceSlices, by name."""
    slices = [s for s in admin.items("resourceslices") if s["spec"]["driver"] == DRIVER]
    return sorted(slices, key=lambda s: s["metadata"]["name"])


def node_slice(cluster: Cluster) -> Obj:
    """The node's slice of devices (the boards' counter sets have a slice of their own)."""
    (found,) = [s for s in driver_slices(cluster.admin) if "sharedCounters" not in s["spec"]]
    return found


def slice_devices(slices: Sequence[Obj]) -> dict[str, Obj]:
    """Every device of the slices, by name."""
    return {device["name"]: device for s in slices for device in s["spec"].get("devices") or []}


def chips_seen(output: str) -> list[Chip]:
    """The chips a container got, checked: exactly their nodes (and /dev/itrctl) and their UUIDs."""
    nodes, env = shown_devices(output)
    chips = sorted((BY_UUID[uuid] for uuid in env["IX_VISIBLE_DEVICES"].split(",")), key=lambda c: c.minor)
    expected = {f"/dev/iluvatar{c.minor}": f"{DEVICE_MAJOR:x}:{c.minor:x}" for c in chips}
    assert nodes == expected | {"/dev/itrctl": f"{DEVICE_MAJOR:x}:ff"}, f"the container's device nodes: {output}"
    return chips


def claim(
    name: str,
    device_class: str = DRIVER,
    count: int = 1,
    selector: str | None = None,
    shares: int | None = None,
    admin_access: bool = False,
    config: Obj | None = None,
    tolerate_taints: bool = False,
) -> Obj:
    """A ResourceClaim of one request `gpu`: count devices of device_class, narrowed by a CEL selector, with a
    capacity request of shares, admin access, an opaque config for the driver, and tolerating every device taint
    (a chip the driver took out of service can still be allocated: its prepare is what the scenario looks at).
    """
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if shares is not None:
        exactly["capacity"] = {"requests": {"shares": str(shares)}}
    if admin_access:
        exactly["adminAccess"] = True
    if tolerate_taints:
        exactly["tolerations"] = [{"operator": "Exists"}]
    devices: Obj = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config is not None:
        devices["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": config}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def minor_is(minor: int) -> str:
    """A CEL selector for the chip (or the board) of this minor."""
    return f'device.attributes["{DRIVER}"].?minor.orValue(-1) == {minor}'


def allocation(admin: Kubectl, namespace: str, name: str) -> Obj | None:
    """The claim's status.allocation (None while it has none)."""
    found = admin.get_or_none("resourceclaim", name, namespace)
    return None if found is None else (found.get("status") or {}).get("allocation")


def results(allocated: Obj) -> list[Obj]:
    """The allocation's results for this driver."""
    return [r for r in allocated["devices"]["results"] if r["driver"] == DRIVER]


def unschedulable_for_devices(pod: Obj) -> bool:
    """The scheduler said the pod cannot go anywhere because its claims cannot be allocated."""
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return "cannot allocate all claims" in condition.get("message", "")
    return False


def prepare_error(admin: Kubectl, namespace: str, pod: str) -> str:
    """The message of the pod's latest event about preparing its claims ('' when there is none)."""
    events = admin.items("events", namespace, "--field-selector", f"involvedObject.name={pod}")
    messages = [e.get("message", "") for e in events if "prepare" in e.get("message", "").lower()]
    return messages[-1] if messages else ""
