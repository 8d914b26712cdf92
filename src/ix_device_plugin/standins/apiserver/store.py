"""The API server stand-in's store: objects, one resourceVersion counter, the watch history and each verb.

Each verb with its semantics: conflicts, merge patches, dry runs, 410 for a version older than the history kept.

It also models the garbage collector of kube-controller-manager, simply: shortly after any change (gc_delay), an
object whose owner references all name owners that no longer exist (no object of that kind and name, or one
with another UID) is deleted, and references to owners that are gone are taken out of the others. Owners of
kinds the stand-in does not serve are taken to exist; finalizers, foreground deletion and orphaning are not
modelled. It runs only inside a running event loop.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ix_device_plugin.standins.apiserver.managedfields import Writer, record_write
from ix_device_plugin.standins.apiserver.protocol import (
    KINDS,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Change,
    Kind,
    Object,
    StatusError,
    invalid,
    merge_patch,
    name_problems,
    not_found,
    now,
    object_body,
    status_object,
)


@dataclass(eq=False)
class Watch:
    """One open watch: what it selects, and the queue its stream is fed from (None ends it)."""

    plural: str
    namespace: str | None
    matches: Callable[[Object], bool]
    queue: asyncio.Queue[Change | None] = field(default_factory=asyncio.Queue)


@dataclass
class Refusal:
    """The next `times` writes (create, replace) of a kind refused with 422 naming field, as an admission webhook or
    policy does for a while."""

    plural: str
    field: str
    message: str
    times: int


class Store:
    """Objects by kind, namespace and name; every change numbered and kept for watches."""

    def __init__(self, history: int = 1000) -> None:
        self.history_limit = history
        self.device_taints = True  # False: ResourceSlice device taints are dropped on write (DRADeviceTaints off)
        self.shared_counters = True  # False: counters dropped on write (DRAPartitionableDevices off)
        self.consumable_capacity = (
            True  # False: allowMultipleAllocations, request policies dropped (DRAConsumableCapacity off)
        )
        self.counters_refused = False  # True: ResourceSlice writes holding counters refused, 422 naming the fields
        self.refusals: list[Refusal] = []  # writes refused for a while (refuse_writes)
        self.garbage_collector = True  # False: objects whose owners are gone stay
        self.gc_delay = 0.05  # seconds from a change to the collection it causes
        self._gc_pending: asyncio.TimerHandle | None = None
        self._objects: dict[tuple[str, str, str], Object] = {}  # (plural, namespace or "", name) -> object
        self._history: list[Change] = []
        self._oldest_kept = 0  # versions at or below this are gone from the history
        self._version = 0
        self._watches: set[Watch] = set()

    def refuse_writes(self, plural: str, field: str, message: str = "Invalid value: refused", times: int = 1) -> None:
        """Answer the next times writes of plural with 422 Invalid naming field (what an admission webhook does)."""
        self.refusals.append(Refusal(plural, field, message, times))

    def compact(self) -> None:
        """Forget the watch history: a watch from any version seen so far gets 410 Expired."""
        self._history.clear()
        self._oldest_kept = self._version

    @property
    def resource_version(self) -> int:
        """The last resourceVersion given out."""
        return self._version

    def get(self, plural: str, name: str, namespace: str = "") -> Object | None:
        """A copy of a stored object, or None."""
        obj = self._objects.get((plural, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def objects(self, plural: str) -> list[Object]:
        """Copies of every stored object of a kind."""
        return [copy.deepcopy(obj) for (kind, _, _), obj in sorted(self._objects.items()) if kind == plural]

    def put(self, plural: str, obj: Object) -> Object:
        """Store obj (created or replaced without checks) and tell the watches; the stored copy."""
        kind = next(kind for kind in KINDS if kind.plural == plural)
        metadata = obj.setdefault("metadata", {})
        namespace = metadata.get("namespace", "") if kind.namespaced else ""
        key = (plural, namespace, metadata["name"])
        existing = self._objects.get(key)
        if existing is not None:
            metadata.setdefault("uid", existing["metadata"]["uid"])
            metadata.setdefault("creationTimestamp", existing["metadata"]["creationTimestamp"])
        return self._store(kind, obj, "MODIFIED" if existing is not None else "ADDED")

    def remove(self, plural: str, name: str, namespace: str = "") -> Object:
        """Delete a stored object (a DELETED event); the object as deleted."""
        kind = next(kind for kind in KINDS if kind.plural == plural)
        return self._delete(kind, namespace, name)

    def delete(self, plural: str, name: str, namespace: str = "") -> Object:
        """Delete a stored object (a DELETED event); the object as it was."""
        kind = next(kind for kind in KINDS if kind.plural == plural)
        return self._delete(kind, namespace if kind.namespaced else "", name)

    def add_node(self, name: str, labels: Mapping[str, str] | None = None) -> Object:
        """Store a node with labels."""
        return self.put(
            "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})}}
        )

    def set_node_labels(self, name: str, labels: Mapping[str, str]) -> Object:
        """Replace a node's labels (a MODIFIED event)."""
        node = self.get("nodes", name)
        assert node is not None, f"no node {name}"
        node["metadata"]["labels"] = dict(labels)
        return self.put("nodes", node)

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        phase: str = "Running",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        limits: Mapping[str, Mapping[str, str]] | None = None,
    ) -> Object:
        """Store a pod bound to node; limits maps a container name to its resource limits."""
        containers = [
            {"name": container, "resources": {"limits": dict(limit)}} for container, limit in (limits or {}).items()
        ]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": dict(labels or {}),
                "annotations": dict(annotations or {}),
            },
            "spec": {"nodeName": node, "containers": containers or [{"name": "main"}]},
            "status": {"phase": phase},
        }
        return self.put("pods", pod)

    def _store(self, kind: Kind, obj: Object, change: str) -> Object:
        self._version += 1
        metadata = obj["metadata"]
        metadata["resourceVersion"] = str(self._version)
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", now())
        if kind.namespaced:
            metadata.setdefault("namespace", "default")
        else:
            metadata.pop("namespace", None)
        obj.setdefault("kind", kind.kind)
        key = (kind.plural, metadata.get("namespace", ""), metadata["name"])
        self._objects[key] = copy.deepcopy(obj)
        self._changed(kind.plural, change, obj)
        return copy.deepcopy(obj)

    def _delete(self, kind: Kind, namespace: str, name: str) -> Object:
        obj = self._objects.pop((kind.plural, namespace, name))
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self._changed(kind.plural, "DELETED", obj)
        return obj

    def _changed(self, plural: str, change_type: str, obj: Object) -> None:
        change = Change(self._version, plural, change_type, copy.deepcopy(obj))
        self._history.append(change)
        if len(self._history) > self.history_limit:
            dropped = self._history.pop(0)
            self._oldest_kept = dropped.resource_version
        for watch in self._watches:
            if _watch_wants(watch, change):
                watch.queue.put_nowait(change)
        self._collect_soon()

    # ---- the garbage collector -------------------------------------------------------------

    def _collect_soon(self) -> None:
        if not self.garbage_collector or self._gc_pending is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # used outside an event loop: nothing collects
            return
        self._gc_pending = loop.call_later(self.gc_delay, self.collect_garbage)

    def stop_collecting(self) -> None:
        """Cancel a collection still to come."""
        if self._gc_pending is not None:
            self._gc_pending.cancel()
            self._gc_pending = None

    def collect_garbage(self) -> None:
        """Delete the objects whose owners are all gone; take references to gone owners out of the others."""
        self._gc_pending = None
        if not self.garbage_collector:
            return
        for (plural, namespace, name), obj in list(self._objects.items()):
            references = obj["metadata"].get("ownerReferences") or []
            gone = [ref for ref in references if not self._owner_exists(ref, namespace)]
            if not gone:
                continue
            kind = next(kind for kind in KINDS if kind.plural == plural)
            if len(gone) == len(references):
                self._delete(kind, namespace, name)
                continue
            kept = copy.deepcopy(obj)
            kept["metadata"]["ownerReferences"] = [ref for ref in references if ref not in gone]
            self._store(kind, kept, "MODIFIED")

    def _owner_exists(self, reference: Mapping[str, Any], namespace: str) -> bool:
        kind = next((kind for kind in KINDS if kind.kind == reference.get("kind")), None)
        if kind is None:
            return True  # a kind this server does not know: the collector cannot tell, and leaves it
        owner = self._objects.get((kind.plural, namespace if kind.namespaced else "", str(reference.get("name"))))
        return owner is not None and owner["metadata"].get("uid") == reference.get("uid")

    def matching(self, kind: Kind, namespace: str | None, matches: Callable[[Object], bool]) -> list[Object]:
        """Copies of the objects of kind (in namespace; None: every one) that matches accepts."""
        return [
            copy.deepcopy(obj)
            for (plural, ns, _), obj in sorted(self._objects.items())
            if plural == kind.plural and (namespace is None or ns == namespace) and matches(obj)
        ]

    # ---- the verbs -------------------------------------------------------------------------

    def _read(self, kind: Kind, namespace: str, name: str) -> Object:
        obj = self._objects.get((kind.plural, namespace, name))
        if obj is None:
            raise not_found(kind, name)
        return copy.deepcopy(obj)

    def _create(
        self, kind: Kind, namespace: str | None, body: Any, dry_run: bool = False, writer: Writer | None = None
    ) -> Object:
        obj = object_body(body)
        metadata = obj.setdefault("metadata", {})
        if "name" not in metadata and "generateName" in metadata:
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        name = metadata.get("name")
        if not name:
            raise StatusError(
                422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required value: name is required"
            )
        if kind.namespaced:
            if namespace is None:
                raise StatusError(405, "MethodNotAllowed", "create needs a namespace in the path")
            metadata["namespace"] = namespace
        self._validate(kind, obj)  # as kube-apiserver: validation before the store finds the name taken
        if (kind.plural, namespace or "", name) in self._objects:
            raise StatusError(
                409, "AlreadyExists", f'{kind.plural} "{name}" already exists', {"name": name, "kind": kind.plural}
            )
        for server_field in ("resourceVersion", "uid", "creationTimestamp"):
            metadata.pop(server_field, None)
        if writer is not None:
            record_write(None, obj, writer, now(), metadata.get("managedFields"))
        if dry_run:
            return self._preview(kind, self._admitted(kind, obj))
        return self._store(kind, self._admitted(kind, obj), "ADDED")

    def _replace(
        self, kind: Kind, namespace: str, name: str, body: Any, dry_run: bool = False, writer: Writer | None = None
    ) -> Object:
        current = self._read(kind, namespace, name)
        obj = object_body(body)
        metadata = obj.setdefault("metadata", {})
        if metadata.get("name", name) != name:
            raise StatusError(
                400,
                "BadRequest",
                f"the name of the object ({metadata['name']}) does not match the name on the URL ({name})",
            )
        metadata["name"] = name
        wanted = metadata.get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise StatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": name, "kind": kind.plural},
            )
        metadata["uid"] = current["metadata"]["uid"]
        metadata["creationTimestamp"] = current["metadata"]["creationTimestamp"]
        if kind.namespaced:
            metadata["namespace"] = namespace
        self._validate(kind, obj)
        if writer is not None:
            record_write(current, obj, writer, now(), metadata.get("managedFields"))
        if dry_run:
            return self._preview(kind, self._admitted(kind, obj), current["metadata"]["resourceVersion"])
        return self._store(kind, self._admitted(kind, obj), "MODIFIED")

    def _preview(self, kind: Kind, obj: Object, version: str = "") -> Object:
        """What a dry run answers: obj as it would be stored (server fields set), stored nowhere, told to no one."""
        metadata = obj["metadata"]
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", now())
        if version:
            metadata["resourceVersion"] = version
        if not kind.namespaced:
            metadata.pop("namespace", None)
        obj.setdefault("kind", kind.kind)
        return copy.deepcopy(obj)

    def _validate(self, kind: Kind, obj: Object) -> None:
        """422 for a name that is not a DNS subdomain, a write refused by a pending refusal, or (counters_refused) a
        slice holding counters."""
        name = str(obj["metadata"].get("name", ""))
        if problems := name_problems(name):
            raise invalid(kind, name, problems)
        self._refuse_if_asked(kind, name)
        if kind.plural != "resourceslices" or not self.counters_refused:
            return
        spec = obj.get("spec") or {}
        causes = [("spec.sharedCounters", "FieldValueForbidden", "Forbidden: shared counters are not supported")]
        causes = causes if spec.get("sharedCounters") else []
        for index, device in enumerate(spec.get("devices") or []):
            if device.get("consumesCounters"):
                field = f"spec.devices[{index}].consumesCounters"
                causes.append((field, "FieldValueForbidden", "Forbidden: shared counters are not supported"))
        if causes:
            raise invalid(kind, name, causes)

    def _refuse_if_asked(self, kind: Kind, name: str) -> None:
        """422 for a write of kind while a refusal of its kind is pending (refuse_writes), counting it down."""
        for refusal in self.refusals:
            if refusal.plural == kind.plural and refusal.times > 0:
                refusal.times -= 1
                raise invalid(kind, name, [(refusal.field, "FieldValueInvalid", refusal.message)])

    def _admitted(self, kind: Kind, obj: Object) -> Object:
        """obj as the API server keeps it: without the ResourceSlice fields of features that are off."""
        if kind.plural != "resourceslices":
            return obj
        spec = obj.get("spec") or {}
        if not self.shared_counters:
            spec.pop("sharedCounters", None)
        for device in spec.get("devices") or []:
            if not self.device_taints:
                device.pop("taints", None)
            if not self.shared_counters:
                device.pop("consumesCounters", None)
            if not self.consumable_capacity:
                device.pop("allowMultipleAllocations", None)
                for capacity in (device.get("capacity") or {}).values():
                    capacity.pop("requestPolicy", None)
        return obj

    def patch(
        self, plural: str, name: str, namespace: str, patch: Object, writer: Writer, content_type: str = MERGE_PATCH
    ) -> Object:
        """Patch a stored object as writer would over HTTP (its managedFields recorded); the object as stored."""
        kind = next(kind for kind in KINDS if kind.plural == plural)
        return self._patch(kind, namespace if kind.namespaced else "", name, patch, content_type, writer)

    def _patch(
        self, kind: Kind, namespace: str, name: str, body: Any, content_type: str, writer: Writer | None = None
    ) -> Object:
        current = self._read(kind, namespace, name)
        if content_type not in (MERGE_PATCH, STRATEGIC_PATCH):
            raise StatusError(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
            )
        if not isinstance(body, dict):
            raise StatusError(400, "BadRequest", "the patch is not a JSON object")
        self._refuse_if_asked(kind, name)
        patched = merge_patch(current, body)
        metadata = patched.setdefault("metadata", {})
        metadata["name"] = name
        metadata["uid"] = current["metadata"]["uid"]
        wanted = body.get("metadata", {}).get("resourceVersion") if isinstance(body.get("metadata"), dict) else None
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise StatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been modified',
            )
        if writer is not None:
            given = body["metadata"].get("managedFields") if isinstance(body.get("metadata"), dict) else None
            record_write(current, patched, writer, now(), given)
        return self._store(kind, patched, "MODIFIED")

    def _remove(self, kind: Kind, namespace: str, name: str) -> Object:
        self._read(kind, namespace, name)
        return self._delete(kind, namespace, name)

    def _backlog(self, watch: Watch, since: str) -> list[Object]:
        """What a new watch is sent first: every matching object (no version), the changes after since, or 410."""
        if since in ("", "0"):
            return [
                {"type": "ADDED", "object": copy.deepcopy(obj)}
                for (plural, ns, _), obj in sorted(self._objects.items())
                if plural == watch.plural and (watch.namespace is None or ns == watch.namespace) and watch.matches(obj)
            ]
        try:
            version = int(since)
        except ValueError:
            raise StatusError(400, "BadRequest", f'invalid resource version: "{since}"') from None
        if version < self._oldest_kept:
            message = f"too old resource version: {version} ({self._oldest_kept + 1})"
            return [{"type": "ERROR", "object": status_object(410, "Expired", message)}]
        return [
            {"type": change.type, "object": copy.deepcopy(change.object)}
            for change in self._history
            if change.resource_version > version and _watch_wants(watch, change)
        ]

    def bookmark(self) -> None:
        """Send every open watch a BOOKMARK event carrying the current resourceVersion."""
        for watch in self._watches:
            kind = next(kind for kind in KINDS if kind.plural == watch.plural)
            obj = {"kind": kind.kind, "apiVersion": "v1", "metadata": {"resourceVersion": str(self._version)}}
            watch.queue.put_nowait(Change(self._version, watch.plural, "BOOKMARK", obj))


def _watch_wants(watch: Watch, change: Change) -> bool:
    if change.plural != watch.plural:
        return False
    namespace = change.object.get("metadata", {}).get("namespace", "")
    return (watch.namespace is None or namespace == watch.namespace) and watch.matches(change.object)
