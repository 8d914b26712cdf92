"""Keeps the node's ResourceSlices equal to what the driver wants published, through API server outages.

`SlicePublisher.want` takes the content to publish; `run` writes it: the pool's slices as `pool.py` cuts them,
each created or replaced at its stored resourceVersion with the pool generation bumped once for all of them,
and slices the pool no longer needs deleted; retried with backoff. `republish` writes again even when nothing
changed here (the kubelet deleted the slices, or someone edited them).

What the API server keeps is learnt from what it stores. Device taints: where it drops them, unhealthy devices
are left out instead. Shared counters: board devices are published only once the server is known to keep the
counters that keep a board and its chips apart; where it drops them (DRAPartitionableDevices off) or refuses
them, the node publishes chips only. Consumable capacity: where it drops `allowMultipleAllocations`, each
device is allocated to one claim at a time, which is safe, and said once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ix_device_plugin.apiserver.client import Kube
from ix_device_plugin.apiserver.errors import KubeAlreadyExists, KubeError, KubeNotFound
from ix_device_plugin.apiserver.objects import NODE, RESOURCE_SLICE
from ix_device_plugin.dra.pool import MANAGED_BY, pool_objects, same_owner, same_spec, slice_base_name
from ix_device_plugin.dra.slices import (
    DRIVER,
    UNHEALTHY_TAINT,
    SliceContent,
    counter_set_body,
    counters_dropped,
    sharing_dropped,
    slice_devices,
    taints_dropped,
)
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

WRITE_ATTEMPTS = 5  # a conflict means someone else wrote a slice: read them again, this many times


@dataclass(frozen=True)
class StoredSlice:
    """What the watch of the node's slices keeps of one: whether it is this driver's, and its resourceVersion."""

    ours: bool
    version: str


def stored_slice(obj: Mapping[str, Any]) -> StoredSlice:
    """A watched ResourceSlice as StoredSlice."""
    metadata = obj.get("metadata") or {}
    labels = metadata.get("labels") or {}
    ours = (obj.get("spec") or {}).get("driver") == DRIVER and all(labels.get(k) == v for k, v in MANAGED_BY.items())
    return StoredSlice(ours, str(metadata.get("resourceVersion", "")))


class SlicePublisher:
    """Publishes the content it is given; `published` holds the pool's slices as the API server stored them last."""

    def __init__(self, kube: Kube, node: str) -> None:
        self.kube = kube
        self.node = node
        self.name = slice_base_name(node)
        self.taints: bool | None = None  # None: not known yet whether the API server keeps device taints
        self.counters: bool | None = None  # the same for shared counters (boards and chips from one pool)
        self.sharing: bool | None = None  # the same for allowMultipleAllocations (shared devices)
        self.published: list[dict[str, Any]] | None = None
        self.repairs = 0  # writes made because the stored slices differed from what was last published
        self._node_uid: str | None = None
        self._seen: Mapping[str, str] | None = None  # this driver's slices as the watch last saw them, by name
        self._wanted: tuple[SliceContent, Mapping[str, str]] = (SliceContent((), None), {})
        self._generation = 0  # bumped with every new wish
        self._changed = asyncio.Event()

    def want(self, content: SliceContent, roots: Mapping[str, str]) -> None:
        """Publish this content (with these PCIe roots) as soon as possible."""
        self._wanted = (content, roots)
        self.republish()

    def seen(self, stored: Mapping[str, str]) -> None:
        """The watch's view of this driver's slices (name -> resourceVersion): repair them when they are not the
        ones last published (someone else edited or deleted them)."""
        self._seen = dict(stored)
        if self.published is not None and self._seen != _versions(self.published):
            self.republish()

    def missing(self) -> list[str]:
        """The slices last published that the watch no longer sees."""
        if self._seen is None or self.published is None:
            return []
        return sorted(set(_versions(self.published)) - set(self._seen))

    def republish(self) -> None:
        """Compare the stored slices with the wish again and repair them (no write when they agree)."""
        self._generation += 1
        self._changed.set()

    async def run(self) -> None:
        """Publish each new wish, retrying with backoff until the API server takes it; until cancelled."""
        backoff = Backoff(initial=0.2, cap=30.0)
        errors = OncePerError(log, logging.WARNING)
        published = -1
        while True:
            if published == self._generation:
                self._changed.clear()
                await self._changed.wait()
                continue
            generation = self._generation
            try:
                await self.publish(*self._wanted)
            except KubeError as error:
                errors.failed("cannot publish ResourceSlice %s: %s (retrying)", self.name, error.message)
                await backoff.sleep()
                continue
            errors.succeeded("API server answering again: ResourceSlice %s published", self.name)
            backoff.reset()
            published = generation

    async def publish(self, content: SliceContent, roots: Mapping[str, str]) -> None:
        """Create, update or delete the pool's slices until they say what content says; raises KubeError."""
        await self._learn_node_uid()
        if self.counters is None and content.counter_sets:
            await self._learn_from_stored()
        wrote_any = False
        while True:
            devices, sets = self._wanted_objects(content, roots)
            try:
                stored, wrote = await self._write(devices, sets)
            except KubeError as error:
                if error.status != 422 or not sets or self.counters is not None:
                    raise
                log.warning(
                    "the API server refuses shared counters (%s): publishing chips only, no board devices",
                    error.message,
                )
                self.counters = False
                continue
            wrote_any = wrote_any or wrote
            if not self._learn(devices, sets, stored):
                break
        first = self.published is None
        self.published = stored
        if wrote_any or first:
            self._log(content, stored)

    def _wanted_objects(
        self, content: SliceContent, roots: Mapping[str, str]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The devices and counter sets to publish, as far as what the API server keeps is known."""
        counters = self.counters is not False
        devices = slice_devices(content, roots, self.taints is not False, counters, boards=self.counters is True)
        sets = [counter_set_body(counter_set) for counter_set in content.counter_sets] if counters else []
        if self.sharing is False:  # as the server stores them, so that nothing is written again at rest
            for device in devices:
                device.pop("allowMultipleAllocations", None)
                for capacity in (device.get("capacity") or {}).values():
                    capacity.pop("requestPolicy", None)
        return devices, sets

    async def _learn_from_stored(self) -> None:
        """What the slices stored by an earlier run say the server keeps: a restart that changes nothing writes
        nothing, and never takes the boards out of the pool, even for a moment."""
        stored = list((await self._stored()).values())
        if any((obj.get("spec") or {}).get("sharedCounters") for obj in stored) and any(
            device.get("consumesCounters") for obj in stored for device in (obj.get("spec") or {}).get("devices") or []
        ):
            self.counters = True
        if any(device.get("taints") for obj in stored for device in (obj.get("spec") or {}).get("devices") or []):
            self.taints = True

    def _learn(self, devices: list[dict[str, Any]], sets: list[dict[str, Any]], stored: list[dict[str, Any]]) -> bool:
        """Learn from what was stored whether the server keeps taints and counters; True to publish again."""
        again = False
        if self.taints is None and any("taints" in d for d in devices):
            self.taints = not taints_dropped(devices, stored)
            if self.taints:
                log.info("the API server keeps device taints: unhealthy devices are tainted %s", UNHEALTHY_TAINT)
            else:
                log.warning("the API server drops device taints (DRADeviceTaints off): unhealthy devices are left out")
                again = True
        if self.counters is not False and sets:
            known = self.counters
            self.counters = not counters_dropped(devices, stored)  # checked at every write: a server can change
            if self.counters and known is None:
                log.info("the API server keeps shared counters: boards and their chips are published together")
            elif not self.counters:
                log.warning(
                    "the API server drops shared counters (DRAPartitionableDevices off): publishing chips only, "
                    "no board devices"
                )
            again = again or self.counters != known  # boards once counters are known to be kept, or counters gone
        if self.sharing is None and sharing_dropped(devices, stored):
            self.sharing = False
            log.warning(
                "the API server drops allowMultipleAllocations (DRAConsumableCapacity off): each device goes to one "
                "claim at a time, sharing.timeSlicing.replicas has no effect"
            )
        return again

    async def _learn_node_uid(self) -> None:
        """The Node's UID, for the slices' owner reference (asked once; without it the slices have no owner)."""
        if self._node_uid is not None:
            return
        node = await self.kube.get_object(NODE, self.node)
        if node is None:
            log.warning("node %s not found: its ResourceSlices get no owner reference", self.node)
            self._node_uid = ""
            return
        self._node_uid = str((node.get("metadata") or {}).get("uid", ""))

    async def _write(
        self, devices: list[dict[str, Any]], sets: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], bool]:
        """The stored slices once they say devices and counter sets, and whether anything was written."""
        for _ in range(WRITE_ATTEMPTS):
            current = await self._stored()
            generation = max((_generation(obj) for obj in current.values()), default=0)
            wanted = pool_objects(self.node, devices, generation, self._node_uid, sets)
            if _agrees(wanted, current):
                return [current[obj["metadata"]["name"]] for obj in wanted], False
            if self.published is not None:
                self.repairs += _differs_from_published(self.published, current)
            try:
                objects = pool_objects(self.node, devices, generation + 1, self._node_uid, sets)
                stored = await self._replace(objects, current)
            except (KubeAlreadyExists, KubeNotFound):
                continue
            except KubeError as error:
                if error.status != 409:
                    raise
                continue
            return stored, True
        message = f"update the ResourceSlices of pool {self.node}: still conflicting after {WRITE_ATTEMPTS} tries"
        raise KubeError(message, 409, "Conflict")

    async def _stored(self) -> dict[str, dict[str, Any]]:
        objects = await self.kube.list_objects(
            RESOURCE_SLICE, field_selector={"spec.nodeName": self.node}, label_selector=MANAGED_BY
        )
        return {
            obj["metadata"]["name"]: obj
            for obj in objects
            if (obj.get("spec") or {}).get("driver") == DRIVER and (obj.get("metadata") or {}).get("name")
        }

    async def _replace(
        self, wanted: list[dict[str, Any]], current: Mapping[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        stored = []
        for obj in wanted:
            existing = current.get(obj["metadata"]["name"])
            if existing is None:
                stored.append(await self.kube.create_object(RESOURCE_SLICE, obj))
                continue
            obj["metadata"]["resourceVersion"] = (existing.get("metadata") or {}).get("resourceVersion", "")
            stored.append(await self.kube.replace_object(RESOURCE_SLICE, obj))
        names = {obj["metadata"]["name"] for obj in wanted}
        for name in sorted(set(current) - names):
            with contextlib.suppress(KubeNotFound):
                await self.kube.delete_object(RESOURCE_SLICE, name)
        return stored

    def _log(self, content: SliceContent, stored: list[dict[str, Any]]) -> None:
        left_out = [d.name for d in content.devices if not d.healthy and self.taints is False]
        tainted = [d.name for d in content.devices if not d.healthy and self.taints]
        count = sum(len((obj.get("spec") or {}).get("devices") or []) for obj in stored)
        sets = sum(len((obj.get("spec") or {}).get("sharedCounters") or []) for obj in stored)
        generation = _generation(stored[0]) if stored else 0
        log.info(
            "ResourceSlice %s: %d devices%s in %d slice(s) (generation %s)%s%s",
            self.name,
            count,
            f" and {sets} board counter sets" if sets else "",
            len(stored),
            generation,
            f"; unhealthy, left out: {', '.join(left_out)}" if left_out else "",
            f"; unhealthy, tainted: {', '.join(tainted)}" if tainted else "",
        )


def _generation(obj: Mapping[str, Any]) -> int:
    try:
        return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)
    except (TypeError, ValueError):
        return 0


def _agrees(wanted: list[dict[str, Any]], current: Mapping[str, dict[str, Any]]) -> bool:
    """True when the stored slices are exactly the wanted ones, each saying what it should, at one generation."""
    if set(current) != {obj["metadata"]["name"] for obj in wanted}:
        return False
    generations = {_generation(obj) for obj in current.values()}
    return len(generations) == 1 and all(
        same_spec(obj["spec"], current[obj["metadata"]["name"]].get("spec") or {})
        and same_owner(obj, current[obj["metadata"]["name"]])
        for obj in wanted
    )


def _versions(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {obj["metadata"]["name"]: str(obj["metadata"].get("resourceVersion", "")) for obj in objects}


def _differs_from_published(published: list[dict[str, Any]], current: Mapping[str, dict[str, Any]]) -> int:
    """1 when the stored slices are not the ones last published (someone else changed or deleted them)."""
    now = {name: str((obj.get("metadata") or {}).get("resourceVersion", "")) for name, obj in current.items()}
    return int(_versions(published) != now)
