"""Helpers for the DRA tests: a node (simulated chips in a file, kubelet directories), its driver and claims."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import yaml

from helpers.waits import until
from ix_device_plugin.apiserver.settings import KubeSettings, settings_from
from ix_device_plugin.dra.checkpoint import CHECKPOINT_FILE
from ix_device_plugin.dra.driver import DraDriver
from ix_device_plugin.dra.pool import slice_base_name
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.settings.options import DraOptions, NodeOptions
from ix_device_plugin.settings.table import DRA
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.dra_kubelet import DraKubeletStandIn

NODE = "node-a"
DRA_FIELDS = {field.name for field in fields(DraOptions)}
TWO_BOARDS: list[dict[str, Any]] = [{"product": "BI-V150"}, {"product": "BI-V150"}]
# A request's device tolerations that tolerate every taint (a burn-in job, or a claim a scenario needs allocated
# on a chip out of service), copied into the allocation's results as the scheduler does.
EVERY_TAINT: tuple[dict[str, str], ...] = ({"operator": "Exists"},)


def answer(response: Any, uid: str) -> Any:
    """What a Prepare or Unprepare response says of the claim uid."""
    return response.claims[uid]


class DraNode:
    """A node with simulated chips described by a file the test edits (hot-plug, health)."""

    def __init__(self, root: Path, api: ApiServerStandIn, node: str = NODE) -> None:
        self.root = root
        # A node's PCI driver directories, which a reset writes (the simulated ixsmi -r refuses without them).
        (root / "sys" / "bus" / "pci" / "drivers").mkdir(parents=True, exist_ok=True)
        self.api = api
        self.node = node
        self.devices_file = root / "devices.yaml"
        self.write_boards(TWO_BOARDS)
        self.cdi_dir = root / "cdi"
        self.kubeconfig = api.write_kubeconfig(root / "kubeconfig")
        if api.get("nodes", node) is None:
            api.add_node(node)
        self.drivers: list[DraDriver] = []
        self.boot_id_file = root / "boot_id"
        self.boot_id_file.write_text("boot-1\n")
        self.checkpoint_file = root / "plugins" / DRIVER / CHECKPOINT_FILE

    def reboot(self) -> None:
        """What a reboot does to the node's files: a new boot ID, and the CDI directory (a tmpfs) empty."""
        self.boot_id_file.write_text(f"boot-{self.boot_id_file.read_text().strip()}-next\n")
        for spec in self.cdi_dir.glob("*"):
            spec.unlink()

    def write_boards(self, boards: Sequence[dict[str, Any]]) -> None:
        """Describe the node's boards (the simulated backend reads the file on every discovery and poll)."""
        self.devices_file.write_text(yaml.safe_dump({"boards": list(boards)}))

    def options(self, **overrides: Any) -> DraOptions:
        """DraOptions for this node, with short intervals, on the simulated chips of its devices file.

        overrides name DraOptions or NodeOptions fields.
        """
        own = {name: overrides.pop(name) for name in list(overrides) if name in DRA_FIELDS}
        base = overrides
        options = NodeOptions(
            mode=DRA,
            backend="simulated",
            simulated_devices=str(self.devices_file),
            dev_root=self.root,
            sysfs_root=self.root / "sys",
            cdi_spec_dir=self.cdi_dir,
            health_interval=0.05,
            rediscover_interval=0.2,
            stop_timeout=0.5,
            health_address="off",
        )
        dra = DraOptions(
            base=replace(options, **base),
            node_name=self.node,
            registrar_dir=self.root / "plugins_registry",
            plugins_dir=self.root / "plugins",
            claim_read_timeout=1.5,
            boot_id_path=self.boot_id_file,
        )
        return replace(dra, **own)

    def kube_settings(self) -> KubeSettings:
        """How the driver reaches the API server stand-in (short timeouts)."""
        return replace(settings_from({"NODE_NAME": self.node}, str(self.kubeconfig), "test"), timeout=1.0)

    async def start(self, backend_factory: Any = None, **overrides: Any) -> DraDriver:
        """A started driver (on backend_factory's backend when given; overrides: options, and healing_rules);
        stopped by stop_all."""
        rules = overrides.pop("healing_rules", None)
        options = self.options(**overrides)
        driver = DraDriver(
            options, kube_settings=self.kube_settings(), backend_factory=backend_factory, healing_rules=rules
        )
        await driver.start()
        self.drivers.append(driver)
        return driver

    async def stop(self, driver: DraDriver) -> None:
        """Stop one driver (a plugin restart)."""
        await driver.shutdown()
        self.drivers.remove(driver)

    async def stop_all(self) -> None:
        """Stop every driver still running."""
        for driver in list(self.drivers):
            await self.stop(driver)

    async def kubelet(self, driver: DraDriver, **kwargs: Any) -> DraKubeletStandIn:
        """A kubelet stand-in registered with driver."""
        kubelet = DraKubeletStandIn(DRIVER, **kwargs)
        await kubelet.register(driver.registrar_socket)
        return kubelet

    def slice(self) -> dict[str, Any] | None:
        """The node's ResourceSlice as the API server stores it."""
        return self.api.get("resourceslices", slice_base_name(self.node))

    def slice_devices(self) -> dict[str, dict[str, Any]]:
        """The slice's devices by name ({} without a slice)."""
        stored = self.slice()
        return {} if stored is None else {d["name"]: d for d in stored["spec"]["devices"]}

    async def wait_slice(self, predicate: Callable[[dict[str, dict[str, Any]]], bool], timeout: float = 5.0) -> None:
        """Wait until the stored slice's devices satisfy predicate."""
        await until(lambda: predicate(self.slice_devices()), timeout=timeout)

    def claim(
        self,
        name: str,
        devices: Sequence[str],
        namespace: str = "default",
        driver: str = DRIVER,
        pool: str | None = None,
        request: str = "gpu",
        admin_access: bool = False,
        shares: int | None = None,
        config: Sequence[dict[str, Any]] = (),
        pod: tuple[str, str] | None = None,
        reserved_for: Sequence[tuple[str, str]] = (),
        tolerations: Sequence[dict[str, Any]] = (),
    ) -> tuple[str, str, str]:
        """Store an allocated ResourceClaim, as the scheduler leaves it; (namespace, name, uid).

        shares: each device allocated as a share taking this many of its shares; config: the allocation's
        config entries (see gpu_config); pod: (name, UID) of the pod it was made for from a template (and
        reserved for); reserved_for: (name, UID) of the pods a claim made on its own is reserved for;
        tolerations: the request's device tolerations, which the scheduler copies into each result.
        """
        uid = str(uuid.uuid4())
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if pod is not None:
            owner = {"apiVersion": "v1", "kind": "Pod", "name": pod[0], "uid": pod[1], "controller": True}
            metadata["ownerReferences"] = [{**owner, "blockOwnerDeletion": True}]
        results = [{"request": request, "driver": driver, "pool": pool or self.node, "device": d} for d in devices]
        for result in results:
            if admin_access:
                result["adminAccess"] = True
            if shares is not None:
                result.update(shareID=str(uuid.uuid4()), consumedCapacity={"shares": str(shares)})
            if tolerations:
                result["tolerations"] = [dict(toleration) for toleration in tolerations]
        exactly: dict[str, Any] = {"deviceClassName": DRIVER}
        if tolerations:
            exactly["tolerations"] = [dict(toleration) for toleration in tolerations]
        self.api.put(
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": metadata,
                "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}},
                "status": {
                    "allocation": {"devices": {"results": results, "config": list(config)}},
                    "reservedFor": [
                        {"resource": "pods", "name": pod_name, "uid": pod_uid}
                        for pod_name, pod_uid in ([pod] if pod is not None else list(reserved_for))
                    ],
                },
            },
        )
        return namespace, name, uid


def store_pod(
    api: ApiServerStandIn,
    name: str,
    uid: str,
    containers: Mapping[str, Sequence[str]],
    templates: Sequence[str] = (),
    namespace: str = "default",
) -> dict[str, Any]:
    """Store a pod whose containers reference claims by name (`claim` or `claim/request`): those in templates
    as made from a ResourceClaimTemplate for the pod, the others as ResourceClaims of their own; the pod."""
    names = list(dict.fromkeys(ref.split("/")[0] for refs in containers.values() for ref in refs))
    entries = [
        {"name": claim, "resourceClaimTemplateName": f"{claim}-template"}
        if claim in templates
        else {"name": claim, "resourceClaimName": claim}
        for claim in names
    ]
    specs = []
    for container, refs in containers.items():
        references = [dict(zip(("name", "request"), ref.split("/"), strict=False)) for ref in refs]
        specs.append({"name": container, "image": "busybox", "resources": {"claims": references}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"containers": specs, "resourceClaims": entries, "nodeName": NODE},
        "status": {"resourceClaimStatuses": [{"name": c, "resourceClaimName": c} for c in names if c in templates]},
    }
    return api.put("pods", pod)


def gpu_config(source: str = "FromClaim", requests: Sequence[str] = (), **fields: Any) -> dict[str, Any]:
    """An allocation config entry holding a GpuConfig with fields (parameters as given, checked by the driver)."""
    parameters = {"apiVersion": "gpu.iluvatar.com/v1alpha1", "kind": "GpuConfig", **fields}
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": DRIVER, "parameters": parameters}}
    if requests:
        entry["requests"] = list(requests)
    return entry
