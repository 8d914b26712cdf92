"""`flags.usevolcano`: Volcano scheduling mode, speaking Iluvatar's protocol exactly.

The plugin keeps the ConfigMap `ix-device-info-cm-<node>` (in its namespace) current: `DeviceInfoCfg`
describes each GPU (name, UUID, PCIe links to the others) and `DeviceListCfg` lists the free healthy
device IDs, both JSON with an `UpdateTime` (Unix seconds). Volcano's scheduler picks devices and writes
them into the pod's `iluvatar.com/DevVolcano` annotation with a `predicate-time`; on Allocate the
kubelet's choice is replaced by those of the oldest such pod whose request size matches, and that pod's
`predicate-time` is set to the largest uint64 so that it is not picked twice. Once the kubelet reports
the pod's devices, the pod is annotated with `iluvatar.com/DevKubelet` (the kubelet's IDs) and
`iluvatar.com/DevRealAlloc` (the IDs really given).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ix_device_plugin.core.allocation import AllocationError
from ix_device_plugin.core.plan import REPLICA_SEPARATOR, Plan

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.client import Kube
    from ix_device_plugin.apiserver.objects import PodDoc

log = logging.getLogger(__name__)

CONFIG_MAP_PREFIX = "ix-device-info-cm-"
DEVICE_INFO_KEY = "DeviceInfoCfg"
DEVICE_LIST_KEY = "DeviceListCfg"
DEV_VOLCANO = "iluvatar.com/DevVolcano"
DEV_KUBELET = "iluvatar.com/DevKubelet"
DEV_REAL_ALLOC = "iluvatar.com/DevRealAlloc"
PREDICATE_TIME = "predicate-time"
TAKEN = str(2**64 - 1)  # predicate-time of a pod whose devices were handed out
LIST_PERIOD = 5.0  # DeviceListCfg is rewritten this often, as upstream does
MATCH_ATTEMPTS = 3  # a pod annotated just now may not be listed yet: look again, a second apart
MATCH_RETRY = 1.0
FINISHED_PHASES = ("Succeeded", "Failed")

# NVML topology level -> (Iluvatar's P2PLinkType index, its name)
LINK_TYPES: dict[int, tuple[int, str]] = {
    0: (6, "P2PLinkSameBoard"),
    10: (5, "P2PLinkSingleSwitch"),
    20: (4, "P2PLinkMultiSwitch"),
    30: (3, "P2PLinkHostBridge"),
    40: (2, "P2PLinkSameCPU"),
    50: (1, "P2PLinkCrossCPU"),
}


# ---- pure: what the ConfigMap says, which pod a request belongs to --------------------------------


def gpu_id(device_id: str) -> str:
    """The GPU a device ID belongs to (a replica's `<uuid>::<i>` -> `<uuid>`)."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def device_info(plan: Plan) -> dict[str, dict[str, Any]]:
    """DeviceInfoCfg's `DeviceInfo`: each GPU by UUID with its name and its links to the other GPUs."""
    gpus: dict[str, Any] = {}
    for device in plan.devices:
        gpus.setdefault(gpu_id(device.id), device)
    info: dict[str, dict[str, Any]] = {}
    for uuid, device in gpus.items():
        links: dict[str, list[dict[str, Any]]] = {}
        for other_uuid, other in gpus.items():
            level = None if other_uuid == uuid else plan.gpu_link(device.gpu, other.gpu)
            if level in LINK_TYPES:
                index, name = LINK_TYPES[level]
                links[other_uuid] = [{"TypeName": name, "TypeIndex": index}]
        product = device.chips[0].product if device.chips else ""
        info[uuid] = {"Name": f"Iluvatar {product}".strip(), "UUID": uuid, "Links": links}
    return info


def free_devices(plan: Plan, allocated: Iterable[str]) -> list[str]:
    """DeviceListCfg's `DeviceList`: healthy device IDs that no running pod holds."""
    taken = set(allocated)
    return [device.id for device in plan.devices if device.healthy and device.id not in taken]


def active(pods: Iterable[PodDoc]) -> list[PodDoc]:
    """Pods that have not finished."""
    return [pod for pod in pods if pod.phase not in FINISHED_PHASES]


def allocated_devices(pods: Iterable[PodDoc]) -> set[str]:
    """Device IDs that pods hold, from their DevRealAlloc annotations."""
    return {device for pod in pods for device in _ids(pod.annotations.get(DEV_REAL_ALLOC, ""))}


def predicate_time(pod: PodDoc) -> int:
    """When Volcano placed the pod; the largest uint64 when it did not say (or said something else)."""
    try:
        return int(pod.annotations.get(PREDICATE_TIME, TAKEN))
    except ValueError:
        return int(TAKEN)


def waiting_for(pod: PodDoc, size: int) -> bool:
    """True when Volcano chose `size` devices for the pod and they were not handed out yet."""
    if pod.deleting or pod.status_reason == "UnexpectedAdmissionError":
        return False
    if pod.annotations.get(PREDICATE_TIME) == TAKEN or DEV_VOLCANO not in pod.annotations:
        return False
    return len(pod.annotations[DEV_VOLCANO].split(",")) == size


def oldest_waiting(pods: Iterable[PodDoc], size: int) -> PodDoc | None:
    """The pod Volcano placed first among those waiting for `size` devices."""
    candidates = [pod for pod in active(pods) if waiting_for(pod, size)]
    return min(candidates, key=lambda pod: (predicate_time(pod), pod.namespace, pod.name), default=None)


def allocation_annotations(pod: PodDoc, kubelet_ids: Sequence[str]) -> dict[str, str] | None:
    """DevKubelet and DevRealAlloc for a pod the kubelet gave kubelet_ids, unless it has them already."""
    if DEV_REAL_ALLOC in pod.annotations or not kubelet_ids:
        return None
    real = _ids(pod.annotations.get(DEV_VOLCANO, "")) or list(kubelet_ids)
    return {DEV_KUBELET: ",".join(kubelet_ids), DEV_REAL_ALLOC: ",".join(real)}


def _ids(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


# ---- the shell: the ConfigMap, the pods, the Allocate substitution ----------------------------------

PodDevices = Callable[[], Awaitable[Mapping[tuple[str, str], list[str]]]]  # (namespace, pod) -> device IDs


class VolcanoMode:
    """Keeps `ix-device-info-cm-<node>` current and answers which devices Volcano chose for a request."""

    def __init__(
        self, kube: Kube, namespace: str, node: str, plan: Callable[[], Plan], pod_devices: PodDevices
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.node = node
        self.name = CONFIG_MAP_PREFIX + node
        self._plan = plan
        self._pod_devices = pod_devices
        self._turn = asyncio.Lock()  # one Allocate at a time picks a pod, so no pod is picked twice

    async def pods(self) -> list[PodDoc]:
        """The node's pods that have not finished, as the API server has them now."""
        return active(await self.kube.list_pods(field_selector={"spec.nodeName": self.node}))

    async def publish(self, *, full: bool) -> None:
        """Write DeviceListCfg (and, when full, DeviceInfoCfg) into the ConfigMap."""
        plan, pods = self._plan(), await self.pods()
        now = int(time.time())
        data = {
            DEVICE_LIST_KEY: json.dumps({"DeviceList": free_devices(plan, allocated_devices(pods)), "UpdateTime": now})
        }
        if full:
            data[DEVICE_INFO_KEY] = json.dumps({"DeviceInfo": device_info(plan), "UpdateTime": now})
        from ix_device_plugin.apiserver.errors import KubeNotFound

        try:
            await self.kube.patch_config_map_data(self.namespace, self.name, data)
        except KubeNotFound:
            if not full:  # a new ConfigMap starts with both keys
                await self.publish(full=True)
                return
            await self.kube.create_config_map(self.namespace, self.name, data)

    async def annotate_allocations(self) -> None:
        """Give pods the kubelet has allocated to their DevKubelet and DevRealAlloc annotations."""
        held = await self._pod_devices()
        for pod in await self.pods():
            annotations = allocation_annotations(pod, held.get((pod.namespace, pod.name), []))
            if annotations is not None:
                await self.kube.patch_pod_annotations(pod.namespace, pod.name, annotations)
                log.info("pod %s/%s annotated: %s", pod.namespace, pod.name, annotations)

    async def chosen_devices(self, kubelet_ids: Sequence[str]) -> list[str]:
        """The devices Volcano chose for a container the kubelet gave kubelet_ids; AllocationError if none."""
        async with self._turn:
            for attempt in range(MATCH_ATTEMPTS):
                pod = oldest_waiting(await self.pods(), len(kubelet_ids))
                if pod is not None:
                    await self.kube.patch_pod_annotations(pod.namespace, pod.name, {PREDICATE_TIME: TAKEN})
                    chosen = _ids(pod.annotations[DEV_VOLCANO])
                    log.info(
                        "Volcano mode: pod %s/%s gets %s (the kubelet offered %s)",
                        pod.namespace,
                        pod.name,
                        ",".join(chosen),
                        ",".join(kubelet_ids),
                    )
                    return chosen
                if attempt + 1 < MATCH_ATTEMPTS:
                    await asyncio.sleep(MATCH_RETRY)
        raise AllocationError(
            f"Volcano mode: no pod on node {self.node} waits for {len(kubelet_ids)} device(s) "
            f"(a {DEV_VOLCANO} annotation with that many IDs and a {PREDICATE_TIME} not yet taken)",
            unavailable=True,
        )
