"""Helpers for tests/test_manifests.py: manifest loading, strict schema checks, the chart renderer.

The official `kubernetes` client's models know every field of every built-in kind, but building a
model from a dict silently drops unknown keys, so a typo such as `volumeMount` would pass. The
checker here walks each object against the models' own field tables (`attribute_map` and
`openapi_types`) and reports unknown fields and wrongly typed values, then builds the model to
apply the client's required-field checks.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import models

from helpers.host_tools import require

ROOT = Path(__file__).resolve().parents[2]
STATIC_DIR = ROOT / "deployments" / "static"
CHART_DIR = ROOT / "deployments" / "helm" / "ix-device-plugin"

_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
    "bytes": (str,),
}
# Quantities are int-or-string in the API; the client types them as strings.
_QUANTITY_FIELDS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests")}
# Objects outside the client's models: allowed keys per path (enough for the chart's ServiceMonitor).
_SERVICE_MONITOR_SPEC = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"}
_SERVICE_MONITOR_ENDPOINT = {
    "port", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings",
    "metricRelabelings", "params", "bearerTokenSecret", "tlsConfig",
}  # fmt: skip


def load_render_module() -> ModuleType:
    """scripts/helm_chart.py, the chart rendered by the real helm, which `make manifests` also runs."""
    if "helm_chart" in sys.modules:
        return sys.modules["helm_chart"]
    spec = importlib.util.spec_from_file_location("helm_chart", ROOT / "scripts" / "helm_chart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["helm_chart"] = module
    spec.loader.exec_module(module)
    return module


_RENDERED: dict[str, list[dict[str, Any]]] = {}
HELM_MISSING = "helm not found: set HELM, put helm on PATH, or run `make e2e-build`"


def needs_helm() -> None:
    """Skip the test when there is no helm ($HELM, PATH, or `make e2e-build`'s); fail it in CI (host_tools)."""
    require(HELM_MISSING if load_render_module().find_helm() is None else None)


def render_objects(overrides: dict[str, Any] | None = None, policies: bool = True) -> list[dict[str, Any]]:
    """The chart's objects as `helm template` renders them with overrides (rendered once per overrides), for a
    cluster that serves ValidatingAdmissionPolicy (Kubernetes 1.30+, the admission policies rendered) or, with
    policies=False, one that does not; needs helm (needs_helm)."""
    render = load_render_module()
    needs_helm()
    key = json.dumps([overrides or {}, policies], sort_keys=True)
    if key not in _RENDERED:
        text = render.render_chart(render.CHART_DIR, overrides or {}, policies=policies)
        _RENDERED[key] = render.load_objects(text)
    return copy.deepcopy(_RENDERED[key])


def render_failure(overrides: dict[str, Any]) -> str:
    """helm's error when the chart refuses overrides (a `fail` in a template); AssertionError when it renders."""
    render = load_render_module()
    needs_helm()
    try:
        render.render_chart(render.CHART_DIR, overrides)
    except subprocess.CalledProcessError as error:
        return str(error.stderr)
    raise AssertionError(f"the chart rendered {overrides}")


def load_file(path: Path) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def model_name(obj: dict[str, Any]) -> str:
    """The client model class for an object, e.g. apps/v1 DaemonSet -> V1DaemonSet."""
    version = str(obj.get("apiVersion", "")).rpartition("/")[2]
    return version[:1].upper() + version[1:] + str(obj.get("kind", ""))


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Every unknown field, wrongly typed value and missing required field of a manifest object."""
    if obj.get("apiVersion") == "monitoring.coreos.com/v1" and obj.get("kind") == "ServiceMonitor":
        return _service_monitor_errors(obj)
    name = model_name(obj)
    if not hasattr(models, name):
        return [f"{obj.get('apiVersion')} {obj.get('kind')}: not a kind of the Kubernetes API"]
    errors: list[str] = []
    normalised = _walk(obj, name, name, errors)
    if not errors:
        errors += _construct(name, normalised)
    return errors


def _walk(value: Any, type_name: str, path: str, errors: list[str]) -> Any:
    """Check value against a client type name; returns it with quantities as strings."""
    inner = _container_type(type_name)
    if inner is not None:
        kind, item_type = inner
        if kind == "list":
            if not isinstance(value, list):
                errors.append(f"{path}: expected a list, got {type(value).__name__}")
                return value
            return [_walk(item, item_type, f"{path}[{i}]", errors) for i, item in enumerate(value)]
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {type(value).__name__}")
            return value
        return {key: _walk(item, item_type, f"{path}.{key}", errors) for key, item in value.items()}
    if type_name == "object":
        return value
    if type_name in _PRIMITIVES:
        allowed = _PRIMITIVES[type_name]
        if not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool)):
            errors.append(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
        return value
    return _walk_model(value, type_name, path, errors)


def _walk_model(value: Any, type_name: str, path: str, errors: list[str]) -> Any:
    klass = getattr(models, type_name)
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a {type_name} mapping, got {type(value).__name__}")
        return value
    by_json = {json_key: attr for attr, json_key in klass.attribute_map.items()}
    result = {}
    for key, item in value.items():
        if key not in by_json:
            errors.append(f"{path}: unknown field {key!r} in {type_name}")
            continue
        if (type_name, key) in _QUANTITY_FIELDS and isinstance(item, dict):
            item = {name: _quantity(q, f"{path}.{key}.{name}", errors) for name, q in item.items()}
        result[key] = _walk(item, klass.openapi_types[by_json[key]], f"{path}.{key}", errors)
    return result


def _quantity(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        errors.append(f"{path}: expected a quantity, got {value!r}")
    return value


def _container_type(type_name: str) -> tuple[str, str] | None:
    """('list', item type) or ('dict', value type) for both spellings the client generators use."""
    match = re.fullmatch(r"(?:list|List)\[(.+)\]", type_name)
    if match:
        return "list", match.group(1)
    match = re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name)
    if match:
        return "dict", match.group(1) or match.group(2)
    return None


class _Response:
    """The shape of a REST response that older clients' ApiClient.deserialize reads."""

    def __init__(self, data: str) -> None:
        self.data = data


def _construct(type_name: str, data: dict[str, Any]) -> list[str]:
    """Build the client model, which enforces required fields; returns its complaint, if any."""
    klass = getattr(models, type_name)
    try:
        if hasattr(klass, "from_dict"):
            klass.from_dict(data)
        else:
            client.ApiClient().deserialize(_Response(json.dumps(data)), type_name)
    except (ValueError, TypeError) as error:
        return [f"{type_name}: {error}"]
    return []


def _service_monitor_errors(obj: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    unknown_top = set(obj) - {"apiVersion", "kind", "metadata", "spec"}
    errors += [f"ServiceMonitor: unknown field {key!r}" for key in sorted(unknown_top)]
    _walk(obj.get("metadata"), "V1ObjectMeta", "ServiceMonitor.metadata", errors)
    spec = obj.get("spec") or {}
    errors += [f"ServiceMonitor.spec: unknown field {key!r}" for key in sorted(set(spec) - _SERVICE_MONITOR_SPEC)]
    _walk(spec.get("selector"), "V1LabelSelector", "ServiceMonitor.spec.selector", errors)
    endpoints = spec.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        errors.append("ServiceMonitor.spec.endpoints: expected a non-empty list")
        return errors
    for index, endpoint in enumerate(endpoints):
        for key in sorted(set(endpoint) - _SERVICE_MONITOR_ENDPOINT):
            errors.append(f"ServiceMonitor.spec.endpoints[{index}]: unknown field {key!r}")
    return errors


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Pod or of a workload's pod template."""
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The single object of a kind."""
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# The GPU reset helper's container, beside the agent's in the pods of the unprivileged DaemonSets (resetHelper).
RESET_HELPER = "reset-helper"
# The agent's variables of the reset path (how it resets, the helper's socket), which the settings table names with
# the reset helper.
RESET_PATH_ENV = frozenset({"IX_RESET_VIA", "IX_RESET_HELPER_SOCKET"})


def agent_container(obj: dict[str, Any]) -> dict[str, Any]:
    """The agent's container of a DaemonSet or Pod: the one regular container that is not the reset helper."""
    (agent,) = [c for c in pod_spec(obj)["containers"] if c["name"] != RESET_HELPER]
    return agent


def reset_helper_container(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The reset helper's container of a DaemonSet or Pod, or None."""
    found = [c for c in pod_spec(obj)["containers"] if c["name"] == RESET_HELPER]
    assert len(found) <= 1
    return found[0] if found else None
