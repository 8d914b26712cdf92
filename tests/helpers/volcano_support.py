"""Volcano mode's end-to-end helpers: the node's devices, pods as Volcano places them, the daemon with the mode on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from helpers.support import RESOURCE, DaemonFactory, config_flags
from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.deviceplugin.features.volcano import DEV_KUBELET, DEV_REAL_ALLOC, DEV_VOLCANO, PREDICATE_TIME
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.apiserver.managedfields import Writer
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn

NODE = "gpu-node-1"
NAMESPACE = "kube-system"
CONFIG_MAP = f"ix-device-info-cm-{NODE}"
SCHEDULER = "vc-scheduler"  # the field manager Volcano's scheduler writes pod annotations as
CHIP_A, CHIP_B, CHIP_C = (f"GPU-{letter * 8}-0000-0000-0000-00000000000{i}" for i, letter in enumerate("abc"))


def devices(path: Path, unhealthy: tuple[str, ...] = ()) -> str:
    """A simulated devices file with chips A and B (those in unhealthy report an ECC error)."""
    boards = [
        {"product": "BI-V100", "chips": [_chip(uuid, i, uuid in unhealthy)]} for i, uuid in enumerate((CHIP_A, CHIP_B))
    ]
    path.write_text(yaml.safe_dump({"boards": boards}))
    return str(path)


def placed(
    apiserver: ApiServerStandIn,
    name: str,
    devices: str,
    predicate_time: str,
    node: str = NODE,
    *,
    manager: str = SCHEDULER,
    namespace: str = "ml",
    gpus: int | None = None,
) -> None:
    """A pending pod asking for gpus devices (default one per ID; 0: none), that Volcano placed on node with those
    devices: the annotations are written by manager (default Volcano's scheduler) as an API write records it."""
    count = len(devices.split(",")) if gpus is None else gpus
    limits = {"main": {RESOURCE: str(count)}} if count else {}
    apiserver.add_pod(namespace, name, node, phase="Pending", limits=limits)
    annotations = {DEV_VOLCANO: devices, PREDICATE_TIME: predicate_time}
    apiserver.patch("pods", name, namespace, {"metadata": {"annotations": annotations}}, Writer(manager, "v1"))


def held(device: str, predicate_time: str) -> dict[str, str]:
    """The annotations of a pod Volcano placed on device and the plugin allocated it: Volcano's two and the plugin's."""
    return {DEV_VOLCANO: device, PREDICATE_TIME: predicate_time, DEV_KUBELET: device, DEV_REAL_ALLOC: device}


def published(apiserver: ApiServerStandIn) -> dict[str, dict[str, Any]]:
    """The ConfigMap's documents, by key ({} when there is none)."""
    found = apiserver.get("configmaps", CONFIG_MAP, NAMESPACE)
    return {} if found is None else {key: json.loads(value) for key, value in found["data"].items()}


def _chip(uuid: str, minor: int, unhealthy: bool) -> dict[str, Any]:
    chip: dict[str, Any] = {"uuid": uuid, "minor": minor}
    if unhealthy:
        chip["health"] = ["ECC"]
    return chip


@dataclass
class Volcano:
    """A node in Volcano mode (the `volcano` fixture): the daemon on chips A and B with flags.usevolcano, the API
    server playing Volcano's scheduler, the kubelet and its pod-resources API."""

    kubelet: KubeletStandIn
    apiserver: ApiServerStandIn
    pod_resources: PodResourcesStandIn
    start_daemon: DaemonFactory
    short_dir: Path
    tmp_path: Path

    async def start(self, **options: Any) -> Daemon:
        """The daemon started, and registered with its two GPUs; options: other Options fields."""
        kubeconfig = self.apiserver.write_kubeconfig(self.short_dir / "kubeconfig", namespace=NAMESPACE)
        kube = settings_from({"NODE_NAME": NODE, "POD_NAMESPACE": NAMESPACE}, str(kubeconfig), "flags.usevolcano")
        backend = SimulatedBackend(devices(self.tmp_path / "devices.yaml"))
        daemon = await self.start_daemon(
            backend_factory=lambda: backend,
            given=config_flags(use_volcano=True),
            kube=kube,
            pod_resources_socket=self.pod_resources.socket_path,
            **options,
        )
        await self.kubelet.wait_registered(RESOURCE, capacity=2)
        return daemon
