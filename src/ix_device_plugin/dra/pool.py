"""The node's pool as ResourceSlice objects: split to the API server's limits, named for any node, compared as stored.

Pure. One pool named after the node; as many slices as the limits need (resource.k8s.io/v1: at most 128
devices in a slice, 64 when a device has taints or consumes counters), then the boards' counter sets in slices
of their own (a slice holds devices or shared counters, never both; at most 8 counter sets each), every one
with the pool's generation and `resourceSliceCount`, owned by the Node so that they go with it. Names are
`<node>-gpu.iluvatar.com`, then `-1`, `-2`, ...; a node name too long for that is cut and given a hash, so
every name is a valid one; a name held by a slice that is not the pool's is skipped (the next number is used). A
slice is the pool's when it is this driver's, for this node, and labelled `app.kubernetes.io/managed-by:
ix-device-plugin`, in the node's pool, or named as the pool's slices are (so that a slice whose label another
writer removed is still found, and its label put back).
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Collection, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from ix_device_plugin.dra.slices import DRIVER

MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
MAX_NAME = 253
MANAGED_BY = {"app.kubernetes.io/managed-by": "ix-device-plugin"}
_SUFFIX = f"-{DRIVER}"
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
# No device capacity (bytes of memory, shares) comes near 10^30: a longer or larger quantity is refused before any
# arithmetic, which on `1e10000000` (a valid quantity) would build a ten-million-digit integer.
MAX_QUANTITY_TEXT = 64
MAX_QUANTITY_EXPONENT = 30
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": Decimal("0.001")}


def slice_base_name(node: str) -> str:
    """The name of the pool's first slice: `<node>-gpu.iluvatar.com`, cut with a hash when too long."""
    name = f"{node}{_SUFFIX}"
    if len(name) + len("-999") <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = MAX_NAME - len("-999") - len(_SUFFIX) - len(digest) - 1
    return f"{node[:keep].rstrip('.-')}-{digest}{_SUFFIX}"


def slice_names(node: str, count: int, taken: Collection[str] = ()) -> list[str]:
    """The names of a pool of count slices, in order, leaving out those in taken (held by slices that are not the
    pool's, which it cannot take over)."""
    base = slice_base_name(node)
    names = (base if index == 0 else f"{base}-{index}" for index in itertools.count())
    return list(itertools.islice((name for name in names if name not in taken), count))


def pool_slice_name(node: str, name: str) -> bool:
    """True when name is one the node's pool gives its slices (`<node>-gpu.iluvatar.com`, then `-1`, `-2`, ...)."""
    base = slice_base_name(node)
    return name == base or (name.startswith(f"{base}-") and name[len(base) + 1 :].isdigit())


def labelled(obj: Mapping[str, Any]) -> bool:
    """True when obj carries the label that marks this program's slices."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in MANAGED_BY.items())


def owned_slice(obj: Mapping[str, Any], node: str) -> bool:
    """True when obj is one of the node's pool's slices: this driver's, for this node, and labelled as ours, in
    the node's pool, or named as the pool's slices are (only this driver writes its slices for this node)."""
    spec = obj.get("spec") or {}
    if spec.get("driver") != DRIVER or spec.get("nodeName") != node:
        return False
    name = str((obj.get("metadata") or {}).get("name", ""))
    return labelled(obj) or (spec.get("pool") or {}).get("name") == node or pool_slice_name(node, name)


def chunks(devices: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """devices cut into slices that respect the per-slice limits (one, possibly empty, at least)."""
    limit = MAX_DEVICES
    if any("taints" in device or "consumesCounters" in device for device in devices):
        limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS
    return [list(devices[start : start + limit]) for start in range(0, len(devices), limit)] or [[]]


def pool_objects(
    node: str,
    devices: Sequence[dict[str, Any]],
    generation: int,
    node_uid: str | None,
    counter_sets: Sequence[dict[str, Any]] = (),
    taken: Collection[str] = (),
) -> list[dict[str, Any]]:
    """Every ResourceSlice of the pool, in name order (names in taken left out), without resourceVersion: the
    devices, then the counters."""
    parts: list[tuple[str, list[dict[str, Any]]]] = [("devices", part) for part in chunks(devices)]
    for start in range(0, len(counter_sets), MAX_COUNTER_SETS):
        parts.append(("sharedCounters", list(counter_sets[start : start + MAX_COUNTER_SETS])))
    owner = (
        [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}] if node_uid else []
    )
    objects = []
    for name, (field, part) in zip(slice_names(node, len(parts), taken), parts, strict=True):
        metadata: dict[str, Any] = {"name": name, "labels": dict(MANAGED_BY)}
        if owner:
            metadata["ownerReferences"] = owner
        spec = {
            "driver": DRIVER,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(parts)},
            "nodeName": node,
            field: part,
        }
        objects.append({"metadata": metadata, "spec": spec})
    return objects


def same_spec(wanted: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """True when stored says what wanted says, the pool generation aside, with quantities compared by value."""
    return _normal(_without_generation(wanted)) == _normal(_without_generation(stored))


def same_owner(wanted: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """True when stored has wanted's labels and exactly its owner references (none when wanted has none: a
    reference to a Node that is gone would have the garbage collector delete the slice)."""
    metadata, current = wanted.get("metadata") or {}, stored.get("metadata") or {}
    labels = current.get("labels") or {}
    owners_match = (metadata.get("ownerReferences") or []) == (current.get("ownerReferences") or [])
    return all(labels.get(key) == value for key, value in (metadata.get("labels") or {}).items()) and owners_match


def _without_generation(spec: Mapping[str, Any]) -> dict[str, Any]:
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    return {**spec, "pool": pool}


def _normal(value: Any) -> Any:
    """value with every quantity as its number (`"32768Mi"` is `"32Gi"`), without empty fields and without what
    the server adds to a taint (`timeAdded`), for comparisons."""
    if isinstance(value, dict):
        if {"key", "effect", "timeAdded"} <= set(value):
            value = {key: item for key, item in value.items() if key != "timeAdded"}
        return {
            key: _normal_quantity(item) if key in _QUANTITIES else _normal(item)
            for key, item in value.items()
            if item not in ([], {}, None)  # the server leaves empty fields out
        }
    if isinstance(value, list):
        return [_normal(item) for item in value]
    return value


_QUANTITIES = frozenset({"value", "default", "min", "max", "step"})  # capacities, counters, request policies


def _normal_quantity(value: Any) -> Any:
    if isinstance(value, str):
        number = quantity(value)
        return number if number is not None else value
    return _normal(value)


def quantity(text: str) -> Decimal | None:
    """The value of a Kubernetes quantity (`32Gi`, `34359738368`, `1.5k`, `5e3`); None when it is not one, or is
    beyond any device's capacity (more than MAX_QUANTITY_TEXT characters, or 10^MAX_QUANTITY_EXPONENT and more)."""
    text = text.strip()
    if len(text) > MAX_QUANTITY_TEXT:
        return None
    try:
        if "e" in text.lower() and not any(text.endswith(s) for s in ("Ei", "E")):
            number = Decimal(text)
        else:
            match = _QUANTITY.match(text)
            if match is None:
                return None
            mantissa, suffix = match.groups()
            scale = _BINARY.get(suffix) or _DECIMAL.get(suffix)
            if scale is None:
                return None
            number = Decimal(mantissa)
            if number.is_finite() and number and number.adjusted() > MAX_QUANTITY_EXPONENT:
                return None
            number *= scale
    except InvalidOperation:
        return None
    if not number.is_finite() or (number and abs(number.adjusted()) > MAX_QUANTITY_EXPONENT):
        return None
    return number
