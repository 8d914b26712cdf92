"""`flags.usevolcano`: Volcano scheduling mode, speaking Iluvatar's protocol exactly.

The plugin keeps the ConfigMap `ix-device-info-cm-<node>` (in its namespace) current: `DeviceInfoCfg`
describes each GPU (name, UUID, PCIe links to the others) and `DeviceListCfg` lists the free healthy
device IDs, both JSON with an `UpdateTime` (Unix seconds). Volcano's scheduler picks devices and writes
them into the pod's `iluvatar.com/DevVolcano` annotation with a `predicate-time`; on Allocate the
kubelet's choice is replaced by those of the oldest such pod whose request size matches, and that pod's
`predicate-time` is set to the largest uint64 so that it is not picked twice. Once the kubelet reports
the pod's devices, the pod is annotated with `iluvatar.com/DevKubelet` (the kubelet's IDs) and
`iluvatar.com/DevRealAlloc` (the IDs really given). Volcano's annotations are believed only where the pod asks for
the resource on this node and the API server records Volcano's scheduler as their writer (volcanotrust.py): a pod
that does not pass is passed over, said once in the log and in an Event on it, and named when an Allocate finds no
other pod.

What the API server is asked, and when: the node's pods and the ConfigMap are each followed by a watch
(one LIST, then a WATCH from its resourceVersion; a LIST again only when a watch fails or ends early), so
Allocate reads a local view and never lists. The ConfigMap is written only when what it says changes (the
free devices, or the GPUs and their links) or it differs from what it should say (deleted, edited), each
write with an `UpdateTime` later than any before (a reader that takes a newer `UpdateTime` as new data skips
a write that does not move it, even two in one second). A node at rest makes no request beyond its open
watches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Any

from ix_device_plugin.core.allocation import AllocationError
from ix_device_plugin.core.plan import REPLICA_SEPARATOR, Plan
from ix_device_plugin.core.products import full_name
from ix_device_plugin.deviceplugin.features.volcanotrust import Trust
from ix_device_plugin.settings.documents import DocumentError, load_json_text

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.apiserver.objects import ConfigMapDoc, PodDoc
    from ix_device_plugin.apiserver.watch import Mirror

log = logging.getLogger(__name__)

CONFIG_MAP_PREFIX = "ix-device-info-cm-"
DEVICE_INFO_KEY = "DeviceInfoCfg"
DEVICE_LIST_KEY = "DeviceListCfg"
DEV_VOLCANO = "iluvatar.com/DevVolcano"
DEV_KUBELET = "iluvatar.com/DevKubelet"
DEV_REAL_ALLOC = "iluvatar.com/DevRealAlloc"
PREDICATE_TIME = "predicate-time"
TAKEN = str(2**64 - 1)  # predicate-time of a pod whose devices were handed out
_LARGEST = 2**64 - 1
PASS_PERIOD = 5.0  # seconds between looks at the kubelet's allocations (local), to annotate allocated pods
MATCH_WAIT = 2.0  # a pod annotated just now may not have reached the watch yet: wait this long for it
UPDATE_TIME = "UpdateTime"
FINISHED_PHASES = ("Succeeded", "Failed")
CHOICE_KEYS = (DEV_VOLCANO, PREDICATE_TIME)  # the annotations by which Volcano's scheduler steers Allocate

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
        info[uuid] = {"Name": full_name(product), "UUID": uuid, "Links": links}
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
    """When Volcano placed the pod: an unsigned decimal, as Volcano writes it and upstream reads it (ParseUint).

    Anything else (absent, negative, signed, spaced, not ASCII digits, past the largest uint64) is read as the
    largest uint64, as upstream reads it: such a pod comes after every pod Volcano stamped, never before.
    """
    text = pod.annotations.get(PREDICATE_TIME, "")
    if not (0 < len(text) <= len(TAKEN) and text.isascii() and text.isdigit()):
        return _LARGEST
    return min(int(text), _LARGEST)


def waiting_for(pod: PodDoc, size: int) -> bool:
    """True when the pod's annotations say that Volcano chose `size` devices for it, not handed out yet (whether
    they are believed is Trust's to say)."""
    if pod.deleting or pod.status_reason == "UnexpectedAdmissionError":
        return False
    if pod.annotations.get(PREDICATE_TIME) == TAKEN or DEV_VOLCANO not in pod.annotations:
        return False
    return len(pod.annotations[DEV_VOLCANO].split(",")) == size


def held_devices(pods: Iterable[PodDoc], trust: Trust, taken: Set[str] = frozenset()) -> dict[str, PodDoc]:
    """Device ID -> the pod holding it: its DevRealAlloc, or the devices Volcano chose (believed) for a pod that was
    handed them (predicate-time taken, or uid in taken) and is not annotated yet."""
    held: dict[str, PodDoc] = {}
    for pod in pods:
        ids = _ids(pod.annotations.get(DEV_REAL_ALLOC, ""))
        if not ids and (pod.uid in taken or pod.annotations.get(PREDICATE_TIME) == TAKEN) and _chose(pod, trust):
            ids = _ids(pod.annotations.get(DEV_VOLCANO, ""))
        for device in ids:
            held.setdefault(device, pod)
    return held


def clashes(pod: PodDoc, held: Mapping[str, PodDoc]) -> list[tuple[str, PodDoc]]:
    """The devices Volcano chose for pod that another pod holds, with that pod."""
    chosen = _ids(pod.annotations.get(DEV_VOLCANO, ""))
    return [(device, held[device]) for device in chosen if device in held and held[device].uid != pod.uid]


def oldest_waiting(
    pods: Iterable[PodDoc], size: int, trust: Trust, held: Mapping[str, PodDoc] | None = None
) -> PodDoc | None:
    """The pod Volcano placed first among those waiting for `size` devices whose annotations trust believes, none of
    which another pod holds."""
    candidates = [
        pod
        for pod in active(pods)
        if waiting_for(pod, size) and trust.why_not(pod, CHOICE_KEYS) is None and not clashes(pod, held or {})
    ]
    return min(candidates, key=lambda pod: (predicate_time(pod), pod.namespace, pod.name), default=None)


def allocation_annotations(pod: PodDoc, kubelet_ids: Sequence[str], trust: Trust) -> dict[str, str] | None:
    """DevKubelet and DevRealAlloc for a pod the kubelet gave kubelet_ids, unless it has them already: the real IDs
    are those Volcano chose for it (where believed), else the kubelet's."""
    if DEV_REAL_ALLOC in pod.annotations or not kubelet_ids:
        return None
    real = (_ids(pod.annotations.get(DEV_VOLCANO, "")) if _chose(pod, trust) else []) or list(kubelet_ids)
    return {DEV_KUBELET: ",".join(kubelet_ids), DEV_REAL_ALLOC: ",".join(real)}


def needs_devices(pod: PodDoc, resource_name: str) -> bool:
    """True when a container of the pod has a limit on resource_name (the kubelet gives it devices)."""
    return any(container.limits.get(resource_name, "0") not in ("", "0") for container in pod.containers)


Content = dict[str, dict[str, Any]]  # ConfigMap key -> its document without UpdateTime


def wanted_content(plan: Plan, pods: Iterable[PodDoc]) -> Content:
    """What ix-device-info-cm-<node> should say: each GPU and its links, and the free healthy device IDs."""
    return {
        DEVICE_INFO_KEY: {"DeviceInfo": device_info(plan)},
        DEVICE_LIST_KEY: {"DeviceList": free_devices(plan, allocated_devices(pods))},
    }


def stored_content(data: Mapping[str, str]) -> tuple[dict[str, dict[str, Any] | None], int]:
    """What a ConfigMap's data says (None for a key missing or unreadable), and its latest UpdateTime."""
    content: dict[str, dict[str, Any] | None] = {}
    latest = 0
    for key in (DEVICE_INFO_KEY, DEVICE_LIST_KEY):
        try:  # anyone may edit the ConfigMap: read with the limits of every document another process writes
            document = load_json_text(data[key])
        except (KeyError, DocumentError):
            document = None
        if not isinstance(document, dict):
            content[key] = None
            continue
        stamp = document.pop(UPDATE_TIME, 0)
        latest = max(latest, stamp if isinstance(stamp, int) else 0)
        content[key] = document
    return content, latest


def config_map_data(content: Content, keys: Iterable[str], stamp: int) -> dict[str, str]:
    """The ConfigMap data for keys of content, each stamped with UpdateTime, in upstream's JSON layout."""
    return {key: json.dumps({**content[key], UPDATE_TIME: stamp}) for key in keys}


def update_time(now: float, *earlier: int) -> int:
    """The UpdateTime of a write at now: later than every earlier one, so that a reader takes it as new data."""
    return max([int(now), *(stamp + 1 for stamp in earlier)])


def _ids(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def _chose(pod: PodDoc, trust: Trust) -> bool:
    """True when the pod's DevVolcano is believed (its predicate-time is ours once the devices are handed out)."""
    return trust.why_not(pod, (DEV_VOLCANO,)) is None


# ---- the shell: the watches, the ConfigMap, the Allocate substitution --------------------------------

PodDevices = Callable[[], Awaitable[Mapping[tuple[str, str], list[str]]]]  # (namespace, pod) -> device IDs


class VolcanoMode:
    """Keeps `ix-device-info-cm-<node>` current and answers which devices Volcano chose for a request."""

    def __init__(self, api: ApiConnection, plan: Callable[[], Plan], pod_devices: PodDevices, scheduler: str) -> None:
        from ix_device_plugin.apiserver.objects import CONFIG_MAP, POD, config_map_doc, pod_doc
        from ix_device_plugin.apiserver.watch import Mirror
        from ix_device_plugin.deviceplugin.features.volcanorefusals import Refusals

        self.api = api
        self.namespace = api.namespace
        self.node = api.node_name
        self.name = CONFIG_MAP_PREFIX + self.node
        self.pods: Mirror[PodDoc] = Mirror(
            api, POD, pod_doc, f"Volcano mode: pods on node {self.node}", field_selector={"spec.nodeName": self.node}
        )
        self.config_map: Mirror[ConfigMapDoc] = Mirror(
            api,
            CONFIG_MAP,
            config_map_doc,
            f"Volcano mode: ConfigMap {self.namespace}/{self.name}",
            namespace=self.namespace,
            field_selector={"metadata.name": self.name},
        )
        self._plan = plan
        self._pod_devices = pod_devices
        self._turn = asyncio.Lock()  # one Allocate at a time picks a pod, so no pod is picked twice
        self._taken: set[str] = set()  # pods given their devices here, until the watch shows them taken
        self._annotated: set[str] = set()  # pods annotated here, until the watch shows the annotations
        self._clash_said: set[str] = set()  # pods placed on devices others hold, said once
        self._scheduler = scheduler  # the field manager whose Volcano annotations are believed
        self.refusals = Refusals(api, self.node)  # pods whose annotations are not believed, said once each
        self._written: tuple[Content, int] | None = None  # what was last written, at which generation of the watch
        self._stamp = 0  # the last UpdateTime written

    async def follow(self) -> None:
        """Watch the node's pods and the ConfigMap, for ever (cancel to stop)."""
        async with asyncio.TaskGroup() as watches:
            watches.create_task(self.pods.run(), name="volcano-pods")
            watches.create_task(self.config_map.run(), name="volcano-config-map")
            watches.create_task(self.refusals.write_events(), name="volcano-pod-events")

    def trust(self) -> Trust:
        """Whose Volcano annotations are believed now (the resource name follows the config)."""
        return Trust(self.node, self._plan().resource_name, self._scheduler)

    def active_pods(self) -> list[PodDoc]:
        """The node's pods that have not finished, as the watch has them now."""
        return active(self.pods.items.values())

    async def publish(self) -> bool:
        """Write what changed of the ConfigMap (or all of it, when it is missing); True when something was written.

        Nothing is written before both watches have read what is there, nor while the API server has what
        should be there, nor again while the watch has not brought back what was written last.
        """
        if not (self.pods.synced and self.config_map.synced):
            return False
        want = wanted_content(self._plan(), self.active_pods())
        stored = next(iter(self.config_map.items.values()), None)
        content, latest = stored_content(stored.data) if stored is not None else ({}, 0)
        if content == want or self._written == (want, self.config_map.generation):
            return False
        keys = [key for key in want if content.get(key) != want[key]]
        self._stamp = update_time(time.time(), self._stamp, latest)
        await self._write(config_map_data(want, keys, self._stamp), stored is None, want)
        self._written = (want, self.config_map.generation)
        return True

    async def _write(self, data: dict[str, str], missing: bool, want: Content) -> None:
        from ix_device_plugin.apiserver.errors import KubeAlreadyExists, KubeNotFound

        kube = await self.api.kube()
        try:
            if missing:
                await kube.create_config_map(self.namespace, self.name, data)
            else:
                await kube.patch_config_map_data(self.namespace, self.name, data)
        except KubeAlreadyExists:  # made meanwhile: the watch has not brought it yet
            await kube.patch_config_map_data(self.namespace, self.name, config_map_data(want, want, self._stamp))
        except KubeNotFound:  # deleted meanwhile
            await kube.create_config_map(self.namespace, self.name, config_map_data(want, want, self._stamp))

    async def annotate_allocations(self, resource_name: str) -> None:
        """Give pods the kubelet has allocated to their DevKubelet and DevRealAlloc annotations.

        The kubelet's allocations (a local call) are asked for only while a pod that needs devices has none.
        """
        pods = self.active_pods()
        self._annotated &= {pod.uid for pod in pods if DEV_REAL_ALLOC not in pod.annotations}
        waiting = [
            pod
            for pod in pods
            if DEV_REAL_ALLOC not in pod.annotations
            and pod.uid not in self._annotated
            and needs_devices(pod, resource_name)
        ]
        if not waiting:
            return
        held = await self._pod_devices()
        kube = await self.api.kube()
        for pod in waiting:
            annotations = allocation_annotations(pod, held.get((pod.namespace, pod.name), []), self.trust())
            if annotations is not None:
                await kube.patch_pod_annotations(pod.namespace, pod.name, annotations)
                self._annotated.add(pod.uid)
                log.info("pod %s/%s annotated: %s", pod.namespace, pod.name, annotations)

    async def chosen_devices(self, kubelet_ids: Sequence[str]) -> list[str]:
        """The devices Volcano chose for a container the kubelet gave kubelet_ids; AllocationError if none.

        The pods are read from the watch's view; a pod annotated just now is waited for, up to MATCH_WAIT.
        """
        async with self._turn:
            deadline = time.monotonic() + MATCH_WAIT
            while True:
                pod = self._waiting_pod(len(kubelet_ids)) if self.pods.synced else None
                if pod is not None:
                    return await self._take(pod, kubelet_ids)
                left = deadline - time.monotonic()
                if left <= 0 or not await self.pods.changed(left):
                    break
        if not self.pods.synced:
            why = self.pods.problem or "the API server has not answered yet"
            message = f"Volcano mode: the pods on node {self.node} are not known yet: {why}"
            raise AllocationError(message, unavailable=True)
        raise AllocationError(
            f"Volcano mode: no pod on node {self.node} waits for {len(kubelet_ids)} device(s) "
            f"(a {DEV_VOLCANO} annotation with that many IDs and a {PREDICATE_TIME} not yet taken)"
            + self.refusals.named(lambda pod: waiting_for(pod, len(kubelet_ids))),
            unavailable=True,
        )

    def _waiting_pod(self, size: int) -> PodDoc | None:
        pods, trust = self.active_pods(), self.trust()
        self._taken &= {pod.uid for pod in pods if pod.annotations.get(PREDICATE_TIME) != TAKEN}
        self.refusals.keep_only(pods)
        held = held_devices(pods, trust, self._taken)
        for pod in pods:
            if not waiting_for(pod, size):
                continue
            if (why := trust.why_not(pod, CHOICE_KEYS)) is not None:
                self.refusals.refuse(pod, why)
            elif pod.uid not in self._clash_said and (clash := clashes(pod, held)):  # a device goes to one pod only
                device, holder = clash[0]
                log.warning(
                    "Volcano mode: pod %s/%s was placed on %s, which pod %s/%s holds; it is passed over",
                    *(pod.namespace, pod.name, device, holder.namespace, holder.name),
                )
                self._clash_said.add(pod.uid)
        return oldest_waiting((pod for pod in pods if pod.uid not in self._taken), size, trust, held)

    async def _take(self, pod: PodDoc, kubelet_ids: Sequence[str]) -> list[str]:
        kube = await self.api.kube()
        await kube.patch_pod_annotations(pod.namespace, pod.name, {PREDICATE_TIME: TAKEN})
        self._taken.add(pod.uid)
        chosen = _ids(pod.annotations[DEV_VOLCANO])
        log.info(
            "Volcano mode: pod %s/%s gets %s (the kubelet offered %s)",
            pod.namespace,
            pod.name,
            ",".join(chosen),
            ",".join(kubelet_ids),
        )
        return chosen
