"""Writes the pool's ResourceSlices to the API server, owned by the Node, over whatever is stored there now.

Each slice is created or replaced at its stored resourceVersion, with the pool generation bumped once for all of
them, the counter sets before the devices that consume them; slices the pool no longer needs are deleted. A
conflict (someone else wrote a slice) reads them again, up to WRITE_ATTEMPTS times.

The slices are owned by the Node (an owner reference with its UID), so that they go with it. The UID is
followed (`node_seen`, from a watch of the Node) and read again before any slice is created: a Node deleted
and re-created gets its slices' owner references changed to it, and a Node that appears after the slices were
written becomes their owner. The pool's slices are found by label, and by driver, node, pool and name too: a
slice whose label another writer removed is adopted (the label put back). A name held by a slice that is not the
pool's (another driver's, or another node's, which the admission policy forbids this driver to delete) is left to
it: the pool is published under the next free names, and the log says so once per name.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from ix_device_plugin.apiserver.client import Kube
from ix_device_plugin.apiserver.errors import KubeAlreadyExists, KubeError, KubeNotFound
from ix_device_plugin.apiserver.objects import NODE, RESOURCE_SLICE, uid_of, version_of
from ix_device_plugin.dra.pool import MANAGED_BY, labelled, owned_slice, pool_objects, same_owner, same_spec

log = logging.getLogger("ix_device_plugin.dra.publisher")  # the publisher's voice: its writes are the publisher's

WRITE_ATTEMPTS = 5  # a conflict means someone else wrote a slice: read them again, this many times
MAX_TAKEN_NAMES = 64  # names of the pool found held by others before the write gives up (a server gone strange)


class PoolWriter:
    """Writes the pool's slices of node; `repairs` counts the writes made because the stored slices differed from
    what was last published."""

    def __init__(self, kube: Kube, node: str) -> None:
        self.kube = kube
        self.node = node
        self.repairs = 0
        self._node_uid: str | None = None  # the Node's UID for the owner references: None not known, "" no Node
        self._last_owner = ""  # the last UID the Node had
        self.taken: set[str] = set()  # names of the pool held by slices that are not its own

    def node_seen(self, uid: str) -> bool:
        """Remember the Node's UID, saying what changed; True when it did."""
        before, self._node_uid = self._node_uid, uid
        if uid == before:
            return False
        if not uid:
            log.warning("node %s not found: its ResourceSlices get no owner reference until it is there", self.node)
        elif self._last_owner and self._last_owner != uid:
            log.warning(
                "node %s was re-created (UID %s, was %s): its ResourceSlices' owner reference follows",
                self.node,
                uid,
                self._last_owner,
            )
        elif before == "":
            log.info("node %s is there now (UID %s): it owns its ResourceSlices", self.node, uid)
        self._last_owner = uid or self._last_owner
        return True

    async def _read_node_uid(self) -> None:
        """Read the Node's UID (the slices' owner): at the first write, and before any slice is created."""
        node = await self.kube.get_object(NODE, self.node)
        self.node_seen("" if node is None else uid_of(node))

    async def write(
        self,
        devices: list[dict[str, Any]],
        sets: list[dict[str, Any]],
        listed: dict[str, dict[str, Any]] | None,
        published: list[dict[str, Any]] | None,
    ) -> tuple[list[dict[str, Any]], bool]:
        """The stored slices once they say devices and counter sets, and whether anything was written; listed:
        the pool's slices as just read, if they were (a stale listing ends in a conflict, and a read again);
        published: the slices as last published (None: none yet), a write over others a repair."""
        node_read = False
        conflicts = 0
        while conflicts < WRITE_ATTEMPTS:
            current = listed if listed is not None else await self.stored()
            listed = None
            names = {obj["metadata"]["name"] for obj in pool_objects(self.node, devices, 0, None, sets, self.taken)}
            if self._node_uid is None or (not node_read and names - set(current)):
                await self._read_node_uid()  # never a create owned by a Node that is gone
                node_read = True
            generation = max((generation_of(obj) for obj in current.values()), default=0)
            wanted = pool_objects(self.node, devices, generation, self._node_uid, sets, self.taken)
            if _agrees(wanted, current):
                return [current[obj["metadata"]["name"]] for obj in wanted], False
            if published is not None:
                self.repairs += _differs_from_published(published, current)
            try:
                objects = pool_objects(self.node, devices, generation + 1, self._node_uid, sets, self.taken)
                stored = await self._replace(objects, current)
            except NameTaken:
                if len(self.taken) > MAX_TAKEN_NAMES:
                    held = f"the pool {self.node}: {len(self.taken)} of its names held by others"
                    raise KubeError(held, 409) from None
                continue  # not a conflict: the names are chosen again, without the one found taken
            except (KubeAlreadyExists, KubeNotFound):
                conflicts += 1
                continue
            except KubeError as error:
                if error.status != 409:
                    raise
                conflicts += 1
                continue
            return stored, True
        message = f"update the ResourceSlices of pool {self.node}: still conflicting after {WRITE_ATTEMPTS} tries"
        raise KubeError(message, 409, "Conflict")

    async def stored(self) -> dict[str, dict[str, Any]]:
        """The pool's slices as stored, by name: the node's slices of this driver, by label or by name and pool."""
        objects = await self.kube.list_objects(RESOURCE_SLICE, field_selector={"spec.nodeName": self.node})
        return {
            obj["metadata"]["name"]: obj
            for obj in objects
            if owned_slice(obj, self.node) and (obj.get("metadata") or {}).get("name")
        }

    async def _replace(
        self, wanted: list[dict[str, Any]], current: Mapping[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Write wanted over current, the counter sets before the devices that consume them (whoever sees the
        devices finds their counters there); the stored objects, in wanted's order."""
        stored: dict[str, dict[str, Any]] = {}
        for obj in sorted(wanted, key=lambda obj: "sharedCounters" not in obj["spec"]):
            existing = current.get(obj["metadata"]["name"])
            if existing is None:
                stored[obj["metadata"]["name"]] = await self._create(obj)
                continue
            if not labelled(existing):
                log.warning(
                    "ResourceSlice %s (%s) had lost its label %s: another writer removed it; adopted, the label "
                    "put back",
                    obj["metadata"]["name"],
                    _described(existing),
                    _label_text(),
                )
            obj["metadata"]["resourceVersion"] = version_of(existing)
            stored[obj["metadata"]["name"]] = await self.kube.replace_object(RESOURCE_SLICE, obj)
        for name in sorted(set(current) - set(stored)):
            with contextlib.suppress(KubeNotFound):
                await self.kube.delete_object(RESOURCE_SLICE, name)
        return [stored[obj["metadata"]["name"]] for obj in wanted]

    async def _create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create obj; when its name is held by a slice that is not the pool's, remember the name as taken (NameTaken):
        the pool goes under other names rather than delete another node's or driver's slice."""
        try:
            return await self.kube.create_object(RESOURCE_SLICE, obj)
        except KubeAlreadyExists:
            name = obj["metadata"]["name"]
            existing = await self.kube.get_object(RESOURCE_SLICE, name)
            if existing is None or owned_slice(existing, self.node):
                raise  # deleted since, or one of the pool's written since: read them again
            self.taken.add(name)
            log.warning(
                "ResourceSlice %s, a name of this pool, is held by a slice that is not the pool's (%s): left to it, "
                "the pool's slices are published under the next free names",
                name,
                _described(existing),
            )
            raise NameTaken(name) from None


class NameTaken(Exception):
    """A name of the pool turned out held by a slice that is not the pool's."""


def _described(obj: Mapping[str, Any]) -> str:
    """What a slice says it is: driver, node, pool and labels, for the log."""
    spec, metadata = obj.get("spec") or {}, obj.get("metadata") or {}
    pool = (spec.get("pool") or {}).get("name")
    return (
        f"driver {spec.get('driver')!r}, node {spec.get('nodeName')!r}, pool {pool!r}, "
        f"labels {metadata.get('labels') or {}}"
    )


def _label_text() -> str:
    return ",".join(f"{key}={value}" for key, value in MANAGED_BY.items())


def generation_of(obj: Mapping[str, Any]) -> int:
    """The pool generation a slice says (0 when it says none, or nonsense)."""
    try:
        return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)
    except (TypeError, ValueError):
        return 0


def _agrees(wanted: list[dict[str, Any]], current: Mapping[str, dict[str, Any]]) -> bool:
    """True when the stored slices are exactly the wanted ones, each saying what it should, at one generation."""
    if set(current) != {obj["metadata"]["name"] for obj in wanted}:
        return False
    generations = {generation_of(obj) for obj in current.values()}
    return len(generations) == 1 and all(
        same_spec(obj["spec"], current[obj["metadata"]["name"]].get("spec") or {})
        and same_owner(obj, current[obj["metadata"]["name"]])
        for obj in wanted
    )


def _differs_from_published(published: list[dict[str, Any]], current: Mapping[str, dict[str, Any]]) -> int:
    """1 when the stored slices are not the ones last published (someone else changed or deleted them)."""
    now = {name: str((obj.get("metadata") or {}).get("resourceVersion", "")) for name, obj in current.items()}
    return int(versions(published) != now)


def versions(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The slices' resourceVersions, by name."""
    return {obj["metadata"]["name"]: str(obj["metadata"].get("resourceVersion", "")) for obj in objects}
