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
    """A ConfigMapDoc from a ConfigMap object."""
    metadata = obj.get("metadata") or {}
    return ConfigMapDoc(
        metadata.get("namespace", ""),
        metadata.get("name", ""),
        {str(key): str(value) for key, value in (obj.get("data") or {}).items()},
        str(metadata.get("resourceVersion", "")),
    )


def pod_doc(obj: Mapping[str, Any]) -> PodDoc:
    """A PodDoc from a Pod object."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return PodDoc(
        namespace=metadata.get("namespace", ""),
        name=metadata.get("name", ""),
        uid=metadata.get("uid", ""),
        annotations=dict(metadata.get("annotations") or {}),
        phase=(obj.get("status") or {}).get("phase", ""),
        node_name=spec.get("nodeName", ""),
        created=_timestamp(metadata.get("creationTimestamp")),
        containers=_containers(spec.get("containers")),
        resource_version=str(metadata.get("resourceVersion", "")),
        deleting=bool(metadata.get("deletionTimestamp")),
        status_reason=str((obj.get("status") or {}).get("reason", "")),
        init_containers=_containers(spec.get("initContainers")),
        annotation_managers=annotation_managers(metadata),
    )


def _containers(containers: Any) -> tuple[ContainerLimits, ...]:
    """Each container's name, limits and requests."""
    return tuple(
        ContainerLimits(container.get("name", ""), _quantities(container, "limits"), _quantities(container, "requests"))
        for container in containers or []
    )


def _quantities(container: Mapping[str, Any], which: str) -> dict[str, str]:
    return {key: str(value) for key, value in ((container.get("resources") or {}).get(which) or {}).items()}


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """The object's labels."""
    return dict((obj.get("metadata") or {}).get("labels") or {})


def uid_of(obj: Mapping[str, Any]) -> str:
    """The object's UID ("" when it has none)."""
    return str((obj.get("metadata") or {}).get("uid", ""))


def version_of(obj: Mapping[str, Any]) -> str:
    """The object's resourceVersion ("" when it has none)."""
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


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
