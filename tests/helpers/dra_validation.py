"""The API server's rules for ResourceSlices (resource.k8s.io/v1, Kubernetes 1.37), as the DRA tests check a pool.

Written from the upstream validation (pkg/apis/resource/validation/validation.go) and the types' limits
(staging/src/k8s.io/api/resource/v1/types.go); what the scheduler needs of a whole pool (unique device and
counter set names, counters that exist, one type per attribute) is checked across the pool's slices.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from ix_device_plugin.dra.pool import quantity

MAX_DEVICES, MAX_DEVICES_ADVANCED = 128, 64
MAX_COUNTER_SETS, MAX_COUNTERS_PER_SET, MAX_CONSUMPTIONS, MAX_COUNTERS_PER_CONSUMPTION = 8, 32, 2, 32
MAX_ATTRIBUTES_AND_CAPACITIES, MAX_VALUE_LENGTH, MAX_TAINTS, MAX_ID = 32, 64, 16, 32
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
    r"(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)


def slice_errors(obj: Mapping[str, Any]) -> list[str]:
    """What the API server would refuse in one ResourceSlice (empty: it is accepted)."""
    name, spec = obj["metadata"]["name"], obj["spec"]
    errors = [] if len(name) <= 253 and DNS_SUBDOMAIN.match(name) else [f"metadata.name {name!r}"]
    pool = spec["pool"]
    if pool["resourceSliceCount"] <= 0 or pool["generation"] < 0 or not DNS_SUBDOMAIN.match(pool["name"]):
        errors.append(f"{name}: spec.pool {pool}")
    if not spec.get("nodeName"):
        errors.append(f"{name}: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection")
    devices, sets = spec.get("devices") or [], spec.get("sharedCounters") or []
    if "devices" in spec and "sharedCounters" in spec:
        errors.append(f"{name}: only one of `sharedCounters` or `devices` is allowed")
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    if len(devices) > (MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES):
        errors.append(f"{name}: {len(devices)} devices, more than allowed")
    if len(sets) > MAX_COUNTER_SETS:
        errors.append(f"{name}: {len(sets)} counter sets, more than {MAX_COUNTER_SETS}")
    errors += _duplicates(name, "device", (d["name"] for d in devices))
    errors += _duplicates(name, "counter set", (s["name"] for s in sets))
    for counter_set in sets:
        errors += _counters(f"{name}: sharedCounters {counter_set['name']}", counter_set, MAX_COUNTERS_PER_SET)
    for device in devices:
        errors += _device_errors(f"{name}: device {device['name']}", device)
    return errors


def _duplicates(where: str, what: str, names: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    errors = []
    for name in names:
        if name in seen:
            errors.append(f"{where}: duplicate {what} {name}")
        seen.add(name)
    return errors


def _counters(where: str, holder: Mapping[str, Any], limit: int) -> list[str]:
    counters = holder.get("counters") or {}
    errors = [] if DNS_LABEL.match(holder.get("name", holder.get("counterSet", ""))) else [f"{where}: name"]
    if not counters or len(counters) > limit:
        errors.append(f"{where}: {len(counters)} counters")
    for counter, value in counters.items():
        if not DNS_LABEL.match(counter) or quantity(value["value"]) is None:
            errors.append(f"{where}: counter {counter} {value}")
    return errors


def _qualified(name: str) -> bool:
    domain, _, identifier = name.rpartition("/")
    if domain and not (len(domain) <= 63 and DNS_SUBDOMAIN.match(domain)):
        return False
    return len(identifier) <= MAX_ID and bool(C_IDENTIFIER.match(identifier))


def _label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and not (len(prefix) <= 253 and DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_VALUE.match(name))


def _device_errors(where: str, device: Mapping[str, Any]) -> list[str]:
    errors = [] if len(device["name"]) <= 63 and DNS_LABEL.match(device["name"]) else [f"{where}: name"]
    attributes, capacity = device.get("attributes") or {}, device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(f"{where}: more than {MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities")
    for name, value in attributes.items():
        if not _qualified(name) or len(value) != 1 or next(iter(value)) not in ("int", "bool", "string", "version"):
            errors.append(f"{where}: attribute {name} {value}")
        elif "string" in value and len(value["string"]) > MAX_VALUE_LENGTH:
            errors.append(f"{where}: attribute {name} longer than {MAX_VALUE_LENGTH}")
        elif "version" in value and not (SEMVER.match(value["version"]) and len(value["version"]) <= 64):
            errors.append(f"{where}: attribute {name} is not semver")
    multiple = device.get("allowMultipleAllocations") is True
    for name, value in capacity.items():
        if not _qualified(name) or quantity(value["value"]) is None:
            errors.append(f"{where}: capacity {name}")
        if "requestPolicy" in value:
            policy_errors = _policy(value["value"], value["requestPolicy"]) if multiple else ["needs multiple"]
            errors += [f"{where}: capacity {name}: {error}" for error in policy_errors]
    taints = device.get("taints") or []
    if len(taints) > MAX_TAINTS:
        errors.append(f"{where}: more than {MAX_TAINTS} taints")
    for taint in taints:
        value = taint.get("value", "")
        effect_ok = taint.get("effect") in ("None", "NoSchedule", "NoExecute")
        if not (effect_ok and len(value) <= 63 and LABEL_VALUE.match(value) and _label_key(taint["key"])):
            errors.append(f"{where}: taint {taint}")
    consumes = device.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMPTIONS:
        errors.append(f"{where}: more than {MAX_CONSUMPTIONS} counter consumptions")
    errors += _duplicates(where, "counter set", (c["counterSet"] for c in consumes))
    for consumption in consumes:
        errors += _counters(f"{where}: consumes {consumption['counterSet']}", consumption, MAX_COUNTERS_PER_CONSUMPTION)
    return errors


def _policy(capacity: str, policy: Mapping[str, Any]) -> list[str]:
    """validateRequestPolicy for a validRange (the only policy the driver publishes)."""
    value = quantity(capacity)
    default, valid = policy.get("default"), policy.get("validRange")
    if valid is None or default is None or value is None or "validValues" in policy:
        return ["a validRange policy needs a default"]
    number = quantity(default)
    low, high, step = (quantity(valid[k]) if k in valid else None for k in ("min", "max", "step"))
    errors = []
    if low is None or number is None or low > value or number < low:
        errors.append(f"min {valid.get('min')} / default {default}")
    if high is not None and (low is None or low > high or high > value or (number or 0) > high):
        errors.append(f"max {high}")
    if step is not None and low is not None and number is not None:
        aligned = (number - low) % step == 0 and (high is None or (high - low) % step == 0)
        if low + step > value or not aligned:
            errors.append(f"step {step}")
    return errors


def pool_errors(objects: list[Mapping[str, Any]]) -> list[str]:
    """slice_errors of every slice, plus what the pool must hold together: one generation and slice count, device
    and counter set names unique in the pool, every consumed counter published, one type per attribute."""
    errors = [error for obj in objects for error in slice_errors(obj)]
    pools = {(o["spec"]["pool"]["generation"], o["spec"]["pool"]["resourceSliceCount"]) for o in objects}
    if len(pools) != 1 or next(iter(pools))[1] != len(objects):
        errors.append(f"pool: generations and slice counts {pools} for {len(objects)} slices")
    devices = [d for o in objects for d in o["spec"].get("devices") or []]
    sets = {s["name"]: s["counters"] for o in objects for s in o["spec"].get("sharedCounters") or []}
    errors += _duplicates("pool", "device", (d["name"] for d in devices))
    set_names = (s["name"] for o in objects for s in o["spec"].get("sharedCounters") or [])
    errors += _duplicates("pool", "counter set", set_names)
    kinds: dict[str, str] = {}
    for device in devices:
        for consumption in device.get("consumesCounters") or []:
            published = sets.get(consumption["counterSet"], {})
            for counter, value in consumption["counters"].items():
                have = quantity(published[counter]["value"]) if counter in published else Decimal(0)
                if have is None or have < (quantity(value["value"]) or 0):
                    errors.append(f"pool: {device['name']} consumes {consumption['counterSet']}/{counter}")
        for name, value in (device.get("attributes") or {}).items():
            if kinds.setdefault(name, next(iter(value))) != next(iter(value)):
                errors.append(f"pool: attribute {name} has two types")
    return errors
