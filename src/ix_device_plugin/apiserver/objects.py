"""The API objects the features use: their kinds, and the plain documents the calls return for them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from ix_device_plugin.apiserver.managedfields import annotation_managers

Object = dict[str, Any]


@dataclass(frozen=True)
class ObjectKind:
    """A kind of API object: apiVersion, kind, the plural of its REST path, and whether it lives in a namespace."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        """The API group ("" for core)."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        """The version within the group."""
        return self.api_version.rpartition("/")[2]

    def describe(self, name: str, namespace: str | None = None) -> str:
        """ "configmap ns/name", for messages."""
        return (
            f"{self.kind.lower()} {namespace}/{name}"
            if self.namespaced and namespace
            else f"{self.kind.lower()} {name}"
        )


CONFIG_MAP = ObjectKind("v1", "ConfigMap", "configmaps", True)
POD = ObjectKind("v1", "Pod", "pods", True)
NODE = ObjectKind("v1", "Node", "nodes", False)
EVENT = ObjectKind("v1", "Event", "events", True)
RESOURCE_SLICE = ObjectKind("resource.k8s.io/v1", "ResourceSlice", "resourceslices", False)
RESOURCE_CLAIM = ObjectKind("resource.k8s.io/v1", "ResourceClaim", "resourceclaims", True)


@dataclass(frozen=True)
class ConfigMapDoc:
    """A ConfigMap's data and the resourceVersion it was read at."""

    namespace: str
    name: str
    data: dict[str, str]
    resource_version: str


@dataclass(frozen=True)
class ContainerLimits:
    """One container of a pod and its resource limits and requests (quantities as the API gives them, e.g. "1")."""

    name: str
    limits: dict[str, str]
    requests: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PodDoc:
    """What the features read of a pod."""

    namespace: str
    name: str
    uid: str
    annotations: dict[str, str]
    phase: str
    node_name: str
    created: datetime | None
    containers: tuple[ContainerLimits, ...]
    resource_version: str = ""
    deleting: bool = False  # metadata.deletionTimestamp is set
    status_reason: str = ""  # status.reason, e.g. UnexpectedAdmissionError
    init_containers: tuple[ContainerLimits, ...] = ()
    annotation_managers: Mapping[str, frozenset[str]] = field(default_factory=dict)  # key -> who wrote it


def config_map_doc(obj: Mapping[str, Any]) -> ConfigMapDoc:
    """A ConfigMapDoc from a ConfigMap object (a field of another type than the API's reads as absent)."""
    metadata = _mapping(obj.get("metadata"))
    return ConfigMapDoc(
        _text(metadata.get("namespace")),
        _text(metadata.get("name")),
        _texts(obj.get("data")),
        _text(metadata.get("resourceVersion")),
    )


def pod_doc(obj: Mapping[str, Any]) -> PodDoc:
    """A PodDoc from a Pod object (a field of another type than the API's reads as absent)."""
    metadata = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    return PodDoc(
        namespace=_text(metadata.get("namespace")),
        name=_text(metadata.get("name")),
        uid=_text(metadata.get("uid")),
        annotations=_texts(metadata.get("annotations")),
        phase=_text(status.get("phase")),
        node_name=_text(spec.get("nodeName")),
        created=_timestamp(metadata.get("creationTimestamp")),
        containers=_containers(spec.get("containers")),
        resource_version=_text(metadata.get("resourceVersion")),
        deleting=bool(metadata.get("deletionTimestamp")),
        status_reason=_text(status.get("reason")),
        init_containers=_containers(spec.get("initContainers")),
        annotation_managers=annotation_managers(metadata),
    )


def _containers(containers: Any) -> tuple[ContainerLimits, ...]:
    """Each container's name, limits and requests."""
    return tuple(
        ContainerLimits(
            _text(container.get("name")), _quantities(container, "limits"), _quantities(container, "requests")
        )
        for container in _list(containers)
        if isinstance(container, Mapping)
    )


def _quantities(container: Mapping[str, Any], which: str) -> dict[str, str]:
    return _texts(_mapping(container.get("resources")).get(which))


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """The object's labels."""
    return _texts(_mapping(obj.get("metadata")).get("labels"))


def uid_of(obj: Mapping[str, Any]) -> str:
    """The object's UID ("" when it has none)."""
    return _text(_mapping(obj.get("metadata")).get("uid"))


def version_of(obj: Mapping[str, Any]) -> str:
    """The object's resourceVersion ("" when it has none)."""
    return _text(_mapping(obj.get("metadata")).get("resourceVersion"))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    """A string field ("" when absent; a number or a boolean as written, anything else as absent)."""
    if value is None or isinstance(value, Mapping | list):
        return ""
    return value if isinstance(value, str) else str(value)


def _texts(value: Any) -> dict[str, str]:
    """A map of strings (labels, annotations, data, limits): its entries as strings."""
    return {str(key): _text(item) for key, item in _mapping(value).items()}


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


@cache
def resource(kind: ObjectKind) -> Any:
    """The client library's generic (dict) resource class for kind; not registered, so it clashes with nothing."""
    from lightkube.generic_resource import GenericGlobalResource, GenericNamespacedResource, create_api_info

    base = GenericNamespacedResource if kind.namespaced else GenericGlobalResource
    api_info = create_api_info(kind.group, kind.version, kind.kind, kind.plural)
    return type(kind.kind, (base,), {"_api_info": api_info})


@cache
def status_resource(kind: ObjectKind) -> Any:
    """The client library's class for kind's status subresource (`.../<name>/status`)."""
    from lightkube.core import resource as lightkube_resource
    from lightkube.generic_resource import GenericGlobalStatus, GenericNamespacedStatus

    main = resource(kind)._api_info
    api_info = lightkube_resource.ApiInfo(
        resource=main.resource, parent=main.resource, plural=main.plural, verbs=["get", "patch", "put"], action="status"
    )
    base = GenericNamespacedStatus if kind.namespaced else GenericGlobalStatus
    return type(f"{kind.kind}Status", (base,), {"_api_info": api_info})


def as_dict(obj: Any) -> Object:
    """An object the client library returned, as a plain dict."""
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
