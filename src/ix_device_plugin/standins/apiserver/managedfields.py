"""Who wrote which field: `metadata.managedFields`, kept as kube-apiserver keeps it.

For the writes that are not server-side apply (create, update, merge and strategic merge patch; its field manager's
`Updater.Update`).

- The writer is the request's `fieldManager` query parameter, else its User-Agent up to the first `/`, unprintable
  characters left out, cut to 128 bytes (apiserver's managerOrUserAgent and prefixFromUserAgent): a Go client
  that names no manager is recorded under its program's name (client-go's user agent starts with it).
- A write owns, in an `Update` entry of its manager (with apiVersion, time and, for `/status`, the subresource),
  every field it added or changed; other managers lose those fields, and every manager loses the fields the write
  removed; an entry left with no field is dropped. A write that changes nothing changes no entry.
- A request that sets `metadata.managedFields` to a non-empty list replaces what was recorded before its own write
  is counted (an entry `{}` alone clears them); an empty list is ignored, as the real server ignores it. So a
  client can write any manager's name there: the record says who wrote a field only as far as every writer is
  honest, or an admission policy keeps it so.

Simpler than the real one, and enough for the tests: a list is one field, whole (the real server keys the items of
associative lists such as `containers`); the maps whose node is a field of its own (`.` in FieldsV1) are the
metadata's labels and annotations and a ConfigMap's data; `status` is tracked only on the status subresource, and
the rest of the object only on the object itself.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FIELD_MANAGER_LIMIT = 128  # bytes: apimachinery's FieldManagerMaxLength
TRACKED_METADATA = ("labels", "annotations", "ownerReferences", "finalizers")
MAPS = frozenset({("metadata", "labels"), ("metadata", "annotations"), ("data",)})  # their node is a field too
UNTRACKED = frozenset({"apiVersion", "kind", "metadata", "status"})
_NODE = object()  # the value of a map's own node in a field listing

FieldPath = tuple[str, ...]
Entry = dict[str, Any]


@dataclass(frozen=True)
class Writer:
    """Who makes a write, as the record names it: the manager and the API version of the request."""

    manager: str
    api_version: str
    subresource: str = ""  # "status" for a write to the status subresource


def manager_of(field_manager: str | None, user_agent: str) -> str:
    """The manager a request writes as: its fieldManager, else its user agent's prefix (kube-apiserver's rule)."""
    if field_manager:
        return field_manager
    prefix, size = [], 0
    for char in user_agent.split("/", 1)[0]:
        if not char.isprintable():
            continue
        size += len(char.encode())
        if size > FIELD_MANAGER_LIMIT:
            break
        prefix.append(char)
    return "".join(prefix)


def record_write(
    before: Mapping[str, Any] | None, after: dict[str, Any], writer: Writer, now: str, given: Any = None
) -> None:
    """Set after's metadata.managedFields for writer's write that turned before (None: a create) into after;
    given: the request's own metadata.managedFields (None when it set none)."""
    live = ((before or {}).get("metadata") or {}).get("managedFields")
    recorded = _entries(given if _replaces(given) else live)
    old, new = fields_of(before or {}, writer.subresource), fields_of(after, writer.subresource)
    changed = {path for path, value in new.items() if path not in old or old[path] != value}
    removed = set(old) - set(new)
    mine = {"manager": writer.manager, "operation": "Update", "apiVersion": writer.api_version}
    if writer.subresource:
        mine["subresource"] = writer.subresource
    entries: list[Entry] = []
    own: Entry | None = None
    for entry in recorded:
        if _same_writer(entry, mine):
            own = entry
            continue
        owned = decode(entry.get("fieldsV1"))
        if owned & (changed | removed):
            entry = {**entry, "fieldsV1": encode(owned - changed - removed)}
        if entry.get("fieldsV1"):
            entries.append(entry)
    if own is not None or changed:
        owned = ((decode(own.get("fieldsV1")) if own is not None else set()) - removed) | changed
        if owned:
            stamp = now if changed or own is None else own.get("time", now)
            entries.append({**mine, "time": stamp, "fieldsType": "FieldsV1", "fieldsV1": encode(owned)})
    metadata = after.setdefault("metadata", {})
    if entries:
        metadata["managedFields"] = entries
    else:
        metadata.pop("managedFields", None)


def fields_of(obj: Mapping[str, Any], subresource: str = "") -> dict[FieldPath, Any]:
    """The fields a write to obj (or its subresource) is counted on: path -> value (_NODE for a map's own node)."""
    if subresource:
        top = {key: value for key, value in obj.items() if key == subresource}
    else:
        top = {key: value for key, value in obj.items() if key not in UNTRACKED}
        metadata = obj.get("metadata")
        if isinstance(metadata, Mapping):
            top["metadata"] = {key: metadata[key] for key in TRACKED_METADATA if key in metadata}
    found: dict[FieldPath, Any] = {}
    _walk(top, (), found)
    return found


def _walk(value: Any, path: FieldPath, found: dict[FieldPath, Any]) -> None:
    if not isinstance(value, Mapping) or (path and not value and path not in MAPS):
        if path:
            found[path] = copy.deepcopy(value)
        return
    if path in MAPS:
        found[path] = _NODE
    for key, child in value.items():
        _walk(child, (*path, str(key)), found)


def encode(paths: Iterable[FieldPath]) -> dict[str, Any]:
    """FieldsV1 of a set of paths: `f:<name>` at each step, `.` for a node that is a field and has fields below."""
    tree: dict[str, Any] = {}
    paths = sorted(paths)
    for path in paths:
        node = tree
        for step in path:
            node = node.setdefault(f"f:{step}", {})
        if any(len(other) > len(path) and other[: len(path)] == path for other in paths):
            node["."] = {}
    return tree


def decode(fields: Any, path: FieldPath = ()) -> set[FieldPath]:
    """The paths a FieldsV1 names (anything that is not one is skipped)."""
    if not isinstance(fields, Mapping):
        return set()
    paths: set[FieldPath] = set()
    for key, child in fields.items():
        if key == "." and path:
            paths.add(path)
        elif isinstance(key, str) and key.startswith("f:"):
            below = decode(child, (*path, key[2:]))
            paths |= below or {(*path, key[2:])}
    return paths


def _replaces(given: Any) -> bool:
    """True when a request's managedFields replace the record: a non-empty list (`[{}]` clears it)."""
    return isinstance(given, list) and bool(given)


def _entries(value: Any) -> list[Entry]:
    return [dict(entry) for entry in value if isinstance(entry, Mapping) and entry] if isinstance(value, list) else []


def _same_writer(entry: Mapping[str, Any], mine: Mapping[str, Any]) -> bool:
    return all(entry.get(key, "") == mine.get(key, "") for key in ("manager", "operation", "apiVersion", "subresource"))
