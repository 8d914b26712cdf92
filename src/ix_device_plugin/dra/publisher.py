"""Keeps the node's ResourceSlices equal to what the driver wants published, through API server outages.

`SlicePublisher.want` takes the content to publish; `run` writes it: the pool's slices as `pool.py` cuts them,
written by `PoolWriter` (poolwriter.py: owned by the Node, over whatever is stored); retried with backoff.
`republish` writes again even when nothing changed here (the kubelet deleted the slices, or someone edited them).

What the API server keeps is learnt from what it stores, and from its answers to server-side dry runs (nothing
stored, no watch event). Before a write whose content needs shared counters or device taints that the server
is not known to keep, the pool's slices that hold those fields are sent as a dry run, so that the first write
is the right one; slices an earlier run stored answer first, so that a restart that changes nothing writes
nothing. Device taints: where the server drops them, unhealthy devices are left out instead. Shared counters:
board devices are published only where the server keeps the counters that keep a board and its chips apart;
where it drops them (DRAPartitionableDevices off) or refuses them (a 422 whose causes name the counter fields),
the node publishes chips only, and asks the server again later (a dry run, after RECHECK_FIRST seconds,
doubling up to RECHECK_CAP, with jitter): a server that keeps them now gets them back with the boards. Every
write is checked again: a server can change. A 422 for any other field is an error like any other, retried.
Consumable capacity: where the server drops `allowMultipleAllocations`, each device is allocated to one claim
at a time, which is safe, and said once; a new node writes it without asking (such a server stores what the
driver would write knowing it), a restart over stored slices asks first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ix_device_plugin.apiserver.client import Kube
from ix_device_plugin.apiserver.errors import KubeError, KubeInvalid
from ix_device_plugin.apiserver.objects import RESOURCE_SLICE, version_of
from ix_device_plugin.dra.pool import owned_slice, pool_objects, slice_base_name
from ix_device_plugin.dra.poolwriter import PoolWriter, generation_of, versions
from ix_device_plugin.dra.slices import (
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

RECHECK_FIRST = 30.0  # seconds from "the server drops or refuses counters" to asking it again
RECHECK_CAP = 600.0  # the delay doubles up to this (each +-20 %): a round of dry runs every ten minutes at most
COUNTER_FIELDS = ("sharedCounters", "consumesCounters")  # a 422 naming these refuses the counters
# While no API server answers, try again at least this often: the slices are written as soon as it is back, so the
# scheduler does not give out a chip that broke meanwhile from the slice it still has. An unanswered try sends
# no request; a server that answers with an error is given the full backoff.
UNANSWERED_RETRY_S = 1.0
# A change is written this long after it is wished for, with whatever else wished meanwhile: one fault changes the
# slices a few times within milliseconds (the chip's health, then what healing does about it, then the reset and
# its end), and each write replaces every slice of the pool (a new pool generation).
COALESCE_S = 0.05


@dataclass(frozen=True)
class StoredSlice:
    """What the watch of the node's slices keeps of one: whether it is this driver's, and its resourceVersion."""

    ours: bool
    version: str


def stored_slice(obj: Mapping[str, Any], node: str) -> StoredSlice:
    """A watched ResourceSlice of node as StoredSlice."""
    return StoredSlice(owned_slice(obj, node), version_of(obj))


class SlicePublisher:
    """Publishes the content it is given; `published` holds the pool's slices as the API server stored them last.

    counters: whether the server is known to keep shared counters (None: not known yet); wanted: the content to
    publish first, with its PCIe roots.
    """

    def __init__(
        self,
        kube: Kube,
        node: str,
        *,
        counters: bool | None = None,
        wanted: tuple[SliceContent, Mapping[str, str]] | None = None,
    ) -> None:
        self.kube = kube
        self.node = node
        self.name = slice_base_name(node)
        self.taints: bool | None = None  # None: not known yet whether the API server keeps device taints
        self.counters = counters  # the same for shared counters (boards and chips from one pool)
        self.sharing: bool | None = None  # the same for allowMultipleAllocations (shared devices)
        self.published: list[dict[str, Any]] | None = None
        self.writer = PoolWriter(kube, node)
        self._recheck = Backoff(initial=RECHECK_FIRST, cap=RECHECK_CAP)
        self._recheck_at: float | None = None  # when to ask again whether the server keeps counters (monotonic)
        self._seen: Mapping[str, str] | None = None  # this driver's slices as the watch last saw them, by name
        self._wanted: tuple[SliceContent, Mapping[str, str]] = wanted or (SliceContent((), None), {})
        self._generation = 0  # bumped with every new wish
        self._changed = asyncio.Event()
        self._read_first = True  # read the stored slices before the next write (not known to be those published)
        self._replaced: set[str] = set()  # resourceVersions this driver's writes replaced since the watch caught up
        self._publishing = False

    def want(self, content: SliceContent, roots: Mapping[str, str]) -> None:
        """Publish this content (with these PCIe roots) as soon as possible."""
        self._wanted = (content, roots)
        self._wake()

    def seen(self, stored: Mapping[str, str]) -> None:
        """The watch's view of this driver's slices (name -> resourceVersion): repair them when they are not the
        ones last published (someone else edited or deleted them)."""
        self._seen = dict(stored)
        if not self._publishing:  # a publish looks again once it is done: its writes come back one by one
            self._check_seen()

    def _check_seen(self) -> None:
        if self._seen is not None and self.published is not None and not self._watch_agrees(self._seen):
            self.republish()

    def _watch_agrees(self, seen: Mapping[str, str]) -> bool:
        """The watch shows the slices last published, or is still behind this driver's own writes: each slice
        that differs shows a version those writes replaced (a version is never reused, so another writer's is
        new)."""
        published = versions(self.published or [])
        if seen == published:
            self._replaced.clear()
            return True
        return set(seen) == set(published) and all(
            seen[name] == version or seen[name] in self._replaced for name, version in published.items()
        )

    def node_seen(self, uid: str) -> None:
        """The Node's UID as the watch of the Node sees it ("" when there is none): the owner references follow."""
        if self.writer.node_seen(uid):
            self.republish()

    def missing(self) -> list[str]:
        """The slices last published that the watch no longer sees."""
        if self._seen is None or self.published is None:
            return []
        return sorted(set(versions(self.published)) - set(self._seen))

    @property
    def repairs(self) -> int:
        """Writes made because the stored slices differed from what was last published."""
        return self.writer.repairs

    def republish(self) -> None:
        """Read the stored slices again, compare them with the wish and repair them (no write when they agree)."""
        self._read_first = True
        self._wake()

    def _wake(self) -> None:
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
                if not await self._wait_for_change():
                    await self._recheck_counters()
                else:
                    await asyncio.sleep(COALESCE_S)
                continue
            generation = self._generation
            try:
                await self.publish(*self._wanted)
            except KubeError as error:
                self._read_first = True  # what the failed write left stored is not known
                errors.failed("cannot publish ResourceSlice %s: %s (retrying)", self.name, _said(error))
                delay = backoff.next_delay()
                unanswered = error.status is None and error.transient
                await asyncio.sleep(min(delay, UNANSWERED_RETRY_S) if unanswered else delay)
                continue
            errors.succeeded("API server answering again: ResourceSlice %s published", self.name)
            backoff.reset()
            published = generation

    async def _wait_for_change(self) -> bool:
        """Wait for the next wish; False when the time to ask about counters again comes first."""
        delay = None if self._recheck_at is None else max(0.0, self._recheck_at - time.monotonic())
        try:
            async with asyncio.timeout(delay):
                await self._changed.wait()
        except TimeoutError:
            return False
        return True

    async def publish(self, content: SliceContent, roots: Mapping[str, str]) -> None:
        """Create, update or delete the pool's slices until they say what content says; raises KubeError. The
        slices last published stand for the stored ones unless something says they may differ (`republish`, a
        failed write): a write over stale ones conflicts and reads them again, and the watch repairs the rest."""
        self._publishing = True
        try:
            await self._publish(content, roots)
        finally:
            self._publishing = False
        self._check_seen()

    async def _publish(self, content: SliceContent, roots: Mapping[str, str]) -> None:
        current = self._last_published()
        if self._unknown(content, stored=True):
            current = await self.writer.stored()
            self._learn_from_stored(list(current.values()))
            if self._unknown(content, stored=bool(current)):
                await self._probe(content, roots)
        wrote_any = False
        while True:
            devices, sets = self._wanted_objects(content, roots)
            try:
                stored, wrote = await self.writer.write(devices, sets, current, self.published)
            except KubeInvalid as error:
                if not sets or not error.names(*COUNTER_FIELDS):
                    raise  # a refusal of something else: an error, retried
                self._counters_off(f"refuses shared counters ({_causes(error, COUNTER_FIELDS)})")
                current = None
                continue
            current = None
            wrote_any = wrote_any or wrote
            if not self._learn(devices, sets, stored):
                break
        first = self.published is None
        self._replaced.update(versions(self.published or []).values())
        self.published = stored
        if wrote_any or first:
            self._log(content, stored)

    def _last_published(self) -> dict[str, dict[str, Any]] | None:
        """The slices last published, by name, when they stand for the stored ones; None: read those."""
        read_first, self._read_first = self._read_first, False
        if read_first or self.published is None:
            return None
        return {obj["metadata"]["name"]: obj for obj in self.published}

    def _unknown(self, content: SliceContent, stored: bool) -> bool:
        """True when content needs a field that the server may drop or refuse and it is not known whether it keeps
        it. Shared counters and device taints: a write made without knowing would leave the boards out, or show
        an unhealthy device untainted. allowMultipleAllocations only counts where slices are stored: what a
        server that drops it stores is what the driver would write knowing that, but stored slices would be
        written again to say the same."""
        return bool(
            (self.counters is None and content.counter_sets)
            or (self.taints is None and any(not device.healthy for device in content.devices))
            or (stored and self.sharing is None and any(device.shares >= 2 for device in content.devices))
        )

    async def _probe(self, content: SliceContent, roots: Mapping[str, str]) -> None:
        """Learn what the server keeps of content, by a dry run (nothing stored, no watch event) of its slices as
        they would be written if it kept everything not known yet: the first write is then the right one."""
        while True:
            devices, sets = self._wanted_objects(content, roots, assume_kept=True)
            try:
                answers = await self._dry_run_pool(devices, sets)
            except KubeInvalid as error:
                if not sets or not error.names(*COUNTER_FIELDS):
                    raise
                self._counters_off(f"refuses shared counters ({_causes(error, COUNTER_FIELDS)})")
                continue  # asked again without them, for what else is not known
            self._learn(devices, sets, answers)
            return

    def _wanted_objects(
        self, content: SliceContent, roots: Mapping[str, str], assume_kept: bool = False
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The devices and counter sets to publish, as far as what the API server keeps is known; assume_kept:
        with whatever is not known yet, as if the server kept it."""
        counters = self.counters is not False
        boards = counters if assume_kept else self.counters is True
        return pool_devices(content, roots, self.taints is not False, counters, boards, self.sharing is not False)

    def _learn_from_stored(self, stored: list[dict[str, Any]]) -> None:
        """What the slices stored by an earlier run show the server keeps: a restart that changes nothing writes
        nothing and asks nothing, and never takes the boards out of the pool, even for a moment."""
        devices = [device for obj in stored for device in (obj.get("spec") or {}).get("devices") or []]
        kept_sets = any((obj.get("spec") or {}).get("sharedCounters") for obj in stored)
        if self.counters is None and kept_sets and any(device.get("consumesCounters") for device in devices):
            self.counters = True
        if self.taints is None and any(device.get("taints") for device in devices):
            self.taints = True
        if self.sharing is None and any(device.get("allowMultipleAllocations") for device in devices):
            self.sharing = True

    def _learn(self, devices: list[dict[str, Any]], sets: list[dict[str, Any]], stored: list[dict[str, Any]]) -> bool:
        """Learn from what was stored (or a dry run answered) whether the server keeps taints, counters and
        allowMultipleAllocations; True to publish again."""
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
            if counters_dropped(devices, stored):  # checked at every write: a server can change
                self._counters_off("drops shared counters (DRAPartitionableDevices off)")
            else:
                self.counters = True
                self._recheck.reset()
                if known is None:
                    log.info("the API server keeps shared counters: boards and their chips are published together")
            again = again or self.counters != known  # boards once counters are known to be kept, or counters gone
        if self.sharing is None and any(device.get("allowMultipleAllocations") for device in devices):
            self.sharing = not sharing_dropped(devices, stored)
            if not self.sharing:
                log.warning(
                    "the API server drops allowMultipleAllocations (DRAConsumableCapacity off): each device goes to "
                    "one claim at a time, sharing.timeSlicing.replicas has no effect"
                )
        return again

    def _counters_off(self, why: str) -> None:
        """The server does not keep the counters: chips only, and ask it again later (said again at INFO)."""
        level = logging.INFO if self.counters is False else logging.WARNING
        self.counters = False
        delay = self._recheck.next_delay()
        self._recheck_at = time.monotonic() + delay
        log.log(
            level, "the API server %s: publishing chips only, no board devices (asking again in %.3g s)", why, delay
        )

    async def _recheck_counters(self) -> None:
        """Ask the server (a dry run of the pool's slices with counters and boards) whether it keeps the counters
        now; if it does, publish them with the boards."""
        self._recheck_at = None
        content, roots = self._wanted
        if self.counters is not False or not content.counter_sets:
            return
        devices, sets = pool_devices(content, roots, self.taints is not False)
        try:
            answers = await self._dry_run_pool(devices, sets)
        except KubeInvalid as error:
            if error.names(*COUNTER_FIELDS):
                self._counters_off(f"still refuses shared counters ({_causes(error, COUNTER_FIELDS)})")
                return
            answers, problem = [], _said(error)
        except KubeError as error:
            answers, problem = [], error.message
        else:
            problem = ""
        if problem or counters_dropped(devices, answers):
            self._recheck_at = time.monotonic() + self._recheck.next_delay()
            log.info("shared counters asked again: %s", problem or "the API server still drops them")
            return
        log.info("the API server keeps shared counters now (asked again): publishing them with the boards")
        self.counters = True
        self._recheck.reset()
        self.republish()

    async def _dry_run_pool(self, devices: list[dict[str, Any]], sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What the server would store of the pool's slices that show what it keeps: the first to hold each field
        it may drop or refuse (a slice of counter sets, a device consuming counters, tainted, shared)."""
        objects = pool_objects(self.node, devices, 1, None, sets)
        return [await self._dry_run(obj) for obj in _samples(objects)]

    async def _dry_run(self, obj: dict[str, Any]) -> dict[str, Any]:
        """What the server would store of obj, under a name it makes up (so that no existing slice is in the way)."""
        metadata = obj["metadata"]
        metadata["generateName"] = f"{metadata.pop('name')}-check-"
        return await self.kube.create_object(RESOURCE_SLICE, obj, dry_run=True)

    def _log(self, content: SliceContent, stored: list[dict[str, Any]]) -> None:
        left_out = [d.name for d in content.devices if not d.healthy and self.taints is False]
        tainted = [d.name for d in content.devices if not d.healthy and self.taints]
        count = sum(len((obj.get("spec") or {}).get("devices") or []) for obj in stored)
        sets = sum(len((obj.get("spec") or {}).get("sharedCounters") or []) for obj in stored)
        generation = generation_of(stored[0]) if stored else 0
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


def pool_devices(
    content: SliceContent,
    roots: Mapping[str, str],
    taints: bool = True,
    counters: bool = True,
    boards: bool = True,
    sharing: bool = True,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The devices and counter sets the pool publishes for content, as far as the API server keeps device taints,
    shared counters (boards: and the board devices that need them) and allowMultipleAllocations (sharing)."""
    devices = slice_devices(content, roots, taints, counters, boards)
    sets = [counter_set_body(counter_set) for counter_set in content.counter_sets] if counters else []
    if not sharing:  # as the server stores them, so that nothing is written again at rest
        for device in devices:
            device.pop("allowMultipleAllocations", None)
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)
    return devices, sets


def _said(error: KubeError) -> str:
    """error's message, and for a 422 the fields the server named."""
    if isinstance(error, KubeInvalid) and error.fields:
        return f"{error.message} (the API server refuses {', '.join(error.fields)})"
    return error.message


def _causes(error: KubeInvalid, parts: tuple[str, ...]) -> str:
    """The first cause of error that names a field holding one of parts, as `field: message`, and how many more."""
    named = [cause for cause in error.causes if any(part in cause.field for part in parts)]
    if not named:
        return error.message
    first = f"{named[0].field}: {named[0].message}".rstrip(": ")
    return first if len(named) == 1 else f"{first}; {len(named) - 1} more such fields"


PROBED_DEVICE_FIELDS = ("consumesCounters", "taints", "allowMultipleAllocations")


def _samples(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fewest of objects that hold every field a server may drop or refuse: the first to hold each."""
    chosen: list[dict[str, Any]] = []
    for field in ("sharedCounters", *PROBED_DEVICE_FIELDS):
        first = next((obj for obj in objects if field in _fields(obj)), None)
        if first is not None and all(first is not obj for obj in chosen):
            chosen.append(first)
    return chosen


def _fields(obj: Mapping[str, Any]) -> set[str]:
    """The fields of a slice's spec that are set, and those of its devices."""
    spec = obj.get("spec") or {}
    devices = spec.get("devices") or []
    return {key for key, value in spec.items() if value} | {key for device in devices for key in device}
