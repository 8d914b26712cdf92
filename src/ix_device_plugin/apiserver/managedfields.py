"""Who wrote an object's annotations, as the API server records it in `metadata.managedFields`.

Each entry of managedFields names a field manager and, in `fieldsV1`, the fields it owns: `f:metadata` ->
`f:annotations` -> `f:<key>` for an annotation. The API server gives a field to whoever last changed it (the
`fieldManager` of the request, else the program name its user agent starts with). What comes here is another
process's writing: anything that is not that shape (not a list, an entry not an object, a manager that is not
text) names no owner, or an unknown one (""), and is never an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

UNKNOWN = ""  # the owner named by an entry whose manager is not text


def annotation_managers(metadata: Any) -> dict[str, frozenset[str]]:
    """Annotation key -> the field managers that own it, from an object's metadata."""
    entries = metadata.get("managedFields") if isinstance(metadata, Mapping) else None
    owners: dict[str, set[str]] = {}
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, Mapping):
            continue
        manager = entry.get("manager")
        for key in _annotation_keys(entry.get("fieldsV1")):
            owners.setdefault(key, set()).add(manager if isinstance(manager, str) else UNKNOWN)
    return {key: frozenset(managers) for key, managers in owners.items()}


def _annotation_keys(fields: Any) -> list[str]:
    """The annotation keys a fieldsV1 names (`f:metadata` -> `f:annotations` -> `f:<key>`)."""
    metadata = fields.get("f:metadata") if isinstance(fields, Mapping) else None
    annotations = metadata.get("f:annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return []
    return [name[2:] for name in annotations if isinstance(name, str) and name.startswith("f:")]
