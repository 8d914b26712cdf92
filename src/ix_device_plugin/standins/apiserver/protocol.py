"""The API server stand-in's protocol: the kinds it serves, status errors, selectors, merge patches and paths."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

TOKEN = "standin-token"
CORE = ""
RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSIONS = ("v1", "v1beta1", "v1beta2")
FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase")
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

Object = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """A resource the stand-in serves."""

    group: str
    versions: tuple[str, ...]
    plural: str
    kind: str
    namespaced: bool


KINDS = (
    Kind(CORE, ("v1",), "configmaps", "ConfigMap", True),
    Kind(CORE, ("v1",), "pods", "Pod", True),
    Kind(CORE, ("v1",), "nodes", "Node", False),
    Kind(CORE, ("v1",), "events", "Event", True),
    Kind(RESOURCE_GROUP, RESOURCE_VERSIONS, "resourceslices", "ResourceSlice", False),
    Kind(RESOURCE_GROUP, RESOURCE_VERSIONS, "resourceclaims", "ResourceClaim", True),
)
_BY_PLURAL = {(kind.group, kind.plural): kind for kind in KINDS}


@dataclass(frozen=True)
class Recorded:
    """One request as the stand-in received it."""

    method: str
    path: str
    query: Mapping[str, str]
    content_type: str
    body: Any


@dataclass(frozen=True)
class Change:
    """One entry of the watch history."""

    resource_version: int
    plural: str
    type: str
    object: Object


class StatusError(Exception):
    """An answer other than success, sent as a `kind: Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    def status(self) -> Object:
        """The Status object kube-apiserver sends for this error."""
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> Object:
    """A `kind: Status` failure object."""
    status: Object = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = dict(details)
    return status


DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_SUBDOMAIN_LIMIT = 253


def name_problems(name: str) -> list[tuple[str, str, str]]:
    """What kube-apiserver's validation says of an object's name that is not a DNS subdomain (apimachinery's
    IsDNS1123Subdomain, as for the kinds served here), as invalid()'s causes; none for a valid name."""
    problems = []
    if len(name) > DNS_SUBDOMAIN_LIMIT:
        problems.append(f"must be no more than {DNS_SUBDOMAIN_LIMIT} characters")
    if not DNS_SUBDOMAIN.fullmatch(name):
        problems.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
            "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
            f"'{DNS_SUBDOMAIN.pattern}')"
        )
    return [("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {problem}') for problem in problems]


def invalid(kind: Kind, name: str, causes: list[tuple[str, str, str]]) -> StatusError:
    """The 422 kube-apiserver answers for an object its validation refuses; causes are (field, reason, message),
    the message saying each as `<field>: <message>`."""
    said = [f"{field}: {message}" for field, _, message in causes]
    group = f".{kind.group}" if kind.group else ""
    text = f'{kind.kind}{group} "{name}" is invalid: ' + (said[0] if len(said) == 1 else f"[{', '.join(said)}]")
    details = {
        "name": name,
        "group": kind.group,
        "kind": kind.kind,
        "causes": [{"reason": reason, "message": message, "field": field} for field, reason, message in causes],
    }
    return StatusError(422, "Invalid", text, details)


def not_found(kind: Kind, name: str) -> StatusError:
    return StatusError(
        404, "NotFound", f'{kind.plural} "{name}" not found', {"name": name, "group": kind.group, "kind": kind.plural}
    )


# ---- selectors ------------------------------------------------------------------------------

_TERM_SPLIT = re.compile(r",(?![^()]*\))")
_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def field_value(obj: Object, path: str) -> str:
    """The value of a dotted field path of obj, "" when absent."""
    node: Any = obj
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return ""
        node = node[key]
    return str(node)


def field_matcher(selector: str) -> Callable[[Object], bool]:
    """A predicate for a fieldSelector (`a=b`, `a==b`, `a!=b`, comma-joined); 400 for unknown fields."""
    terms: list[tuple[str, str, bool]] = []
    for term in filter(None, (part.strip() for part in selector.split(","))):
        negate = "!=" in term
        key, _, value = term.partition("!=" if negate else "=")
        key, value = key.strip(), value.lstrip("=").strip()
        if key not in FIELDS:
            raise StatusError(400, "BadRequest", f'field label not supported: "{key}"')
        terms.append((key, value, negate))
    return lambda obj: all((field_value(obj, key) == value) != negate for key, value, negate in terms)


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    if match := _SET_TERM.match(term):
        key, operator, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if "!=" in term:
        key, value = (part.strip() for part in term.split("!=", 1))
        return lambda labels: labels.get(key) != value
    if "=" in term:
        key, value = (part.strip().lstrip("=") for part in term.split("=", 1))
        value = value.lstrip("=").strip()
        return lambda labels: labels.get(key) == value
    if term.startswith("!"):
        key = term[1:].strip()
        return lambda labels: key not in labels
    return lambda labels: term in labels


def label_matcher(selector: str) -> Callable[[Object], bool]:
    """A predicate for a labelSelector (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`, comma-joined)."""
    terms = [_label_term(part.strip()) for part in _TERM_SPLIT.split(selector) if part.strip()]

    def matches(obj: Object) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch of target by patch (null removes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_path(group: str, rest: str) -> tuple[str | None, Kind, str | None]:
    """(namespace or None, kind, name or None) of the path after /api/v1 or /apis/<group>/<version>."""
    namespace, kind, name, subresource = parse_subresource_path(group, rest)
    if subresource is not None:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    return namespace, kind, name


def parse_subresource_path(group: str, rest: str) -> tuple[str | None, Kind, str | None, str | None]:
    """(namespace or None, kind, name or None, `status` or None) of the path after the group's prefix."""
    parts = [part for part in rest.split("/") if part]
    namespace: str | None = None
    if len(parts) >= 3 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    subresource = None
    if len(parts) == 3 and parts[2] == "status":
        subresource, parts = "status", parts[:2]
    if not parts or len(parts) > 2 or (group, parts[0]) not in _BY_PLURAL:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    kind = _BY_PLURAL[(group, parts[0])]
    name = parts[1] if len(parts) == 2 else None
    if namespace is not None and not kind.namespaced:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    if namespace is None and kind.namespaced and name is not None:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    return namespace, kind, name, subresource


def object_body(body: Any) -> Object:
    if not isinstance(body, dict):
        raise StatusError(400, "BadRequest", "the body of the request is not a JSON object")
    return copy.deepcopy(body)
