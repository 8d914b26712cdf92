"""The Kubernetes API shell: where to reach the API server, a small typed facade over it, and retries.

Only the features that need the API server use this module (GPU reset coordination, Volcano mode, the
per-node configuration label, DRA). The client library (lightkube) is imported when `connect` is called,
never when this module is imported, so plain device plugging never loads it.

Every `Kube` call has a deadline and raises `KubeError` (or a subclass) whose message names the verb, the
object and the HTTP status. Features call through `Backoff.retry`: API failures are retried with capped,
jittered exponential backoff and never take device plugging down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ix_device_plugin.runtime.logs import OncePerError

if TYPE_CHECKING:
    from lightkube import AsyncClient, KubeConfig

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_TIMEOUT = 10.0  # seconds for one API call
WATCH_SERVER_TIMEOUT = 240  # seconds after which the API server ends a watch; it is resumed
WATCH_IDLE_GRACE = 30.0  # a watch silent this long past the server timeout is presumed dead and resumed
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_MAX = 253
_GONE = 410

T = TypeVar("T")
Object = dict[str, Any]


# ---- errors ---------------------------------------------------------------------------------


class KubeConfigError(Exception):
    """The plugin cannot tell how to reach the API server, or who it runs for; the message says what is missing."""


class KubeError(Exception):
    """An API call failed; the message names the verb, the object and the HTTP status (or why none came)."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason

    @property
    def transient(self) -> bool:
        """True when trying again later may succeed: no answer, throttled, or a server error."""
        return self.status is None or self.status == 429 or self.status >= 500


class KubeNotFound(KubeError):
    """404: the object does not exist."""


class KubeConflict(KubeError):
    """409 Conflict: the object changed since it was read (stale resourceVersion); read it again."""


class KubeAlreadyExists(KubeError):
    """409 AlreadyExists: create found an object of that name."""


# ---- settings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class InCluster:
    """The service account the kubelet mounts into the pod, and the API server's in-cluster address."""

    server: str
    token_file: Path
    ca_file: Path


@dataclass(frozen=True)
class KubeSettings:
    """Who the plugin runs for (node, namespace) and how it reaches the API server."""

    node_name: str
    namespace: str
    kubeconfig: Path | None = None
    in_cluster: InCluster | None = None
    timeout: float = DEFAULT_TIMEOUT

    @property
    def source(self) -> str:
        """Where the API server's address comes from, for logs."""
        if self.kubeconfig is not None:
            return f"kubeconfig {self.kubeconfig}"
        assert self.in_cluster is not None
        return f"in-cluster service account ({self.in_cluster.server}, CA {self.in_cluster.ca_file})"


def settings_from(
    env: Mapping[str, str],
    kubeconfig_flag: str | None,
    needs: str,
    *,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> KubeSettings:
    """KubeSettings from the environment and the --kubeconfig flag; KubeConfigError naming what feature needs what.

    The node is NODE_NAME; the namespace POD_NAMESPACE, else the service account's, else kube-system. The API
    server is the --kubeconfig file, else the file named by KUBECONFIG, else the in-cluster service account.
    """
    node = env.get("NODE_NAME", "").strip()
    if not node:
        raise KubeConfigError(f"{needs} needs NODE_NAME (set it from the downward API: fieldRef spec.nodeName)")
    if len(node) > _NAME_MAX or not _DNS_SUBDOMAIN.match(node):
        raise KubeConfigError(f"{needs}: NODE_NAME {node!r} is not a valid node name (a DNS subdomain)")
    kubeconfig = _kubeconfig_path(env, kubeconfig_flag, needs)
    in_cluster = None if kubeconfig is not None else _in_cluster(env, needs, service_account_dir)
    return KubeSettings(node, _namespace(env, in_cluster, service_account_dir), kubeconfig, in_cluster)


def _kubeconfig_path(env: Mapping[str, str], flag: str | None, needs: str) -> Path | None:
    if flag:
        path = Path(flag)
        if not path.is_file():
            raise KubeConfigError(f"{needs}: --kubeconfig {flag}: no such file")
        return path
    listed = [Path(part) for part in env.get("KUBECONFIG", "").split(os.pathsep) if part]
    if not listed:
        return None
    for path in listed:
        if path.is_file():
            return path
    raise KubeConfigError(f"{needs}: KUBECONFIG={env['KUBECONFIG']}: no such file")


def _in_cluster(env: Mapping[str, str], needs: str, account: Path) -> InCluster:
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    token, ca = account / "token", account / "ca.crt"
    missing = [
        name for name, value in (("KUBERNETES_SERVICE_HOST", host), ("KUBERNETES_SERVICE_PORT", port)) if not value
    ]
    missing += [str(path) for path in (token, ca) if not path.is_file()]
    if missing:
        raise KubeConfigError(
            f"{needs} needs the Kubernetes API server: give --kubeconfig or KUBECONFIG, or run in a pod with a "
            f"service account (missing: {', '.join(missing)})"
        )
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return InCluster(f"https://{host}:{port}", token, ca)


def _namespace(env: Mapping[str, str], in_cluster: InCluster | None, account: Path) -> str:
    namespace = env.get("POD_NAMESPACE", "").strip()
    if namespace:
        return namespace
    if in_cluster is not None:
        with contextlib.suppress(OSError):
            namespace = (account / "namespace").read_text().strip()
    return namespace or DEFAULT_NAMESPACE


# ---- what the calls return --------------------------------------------------------------------


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
    """One container of a pod and its resource limits (quantities as the API gives them, e.g. "1")."""

    name: str
    limits: dict[str, str]


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
    containers = tuple(
        ContainerLimits(
            container.get("name", ""),
            {key: str(value) for key, value in ((container.get("resources") or {}).get("limits") or {}).items()},
        )
        for container in spec.get("containers") or []
    )
    return PodDoc(
        namespace=metadata.get("namespace", ""),
        name=metadata.get("name", ""),
        uid=metadata.get("uid", ""),
        annotations=dict(metadata.get("annotations") or {}),
        phase=(obj.get("status") or {}).get("phase", ""),
        node_name=spec.get("nodeName", ""),
        created=_timestamp(metadata.get("creationTimestamp")),
        containers=containers,
        resource_version=str(metadata.get("resourceVersion", "")),
        deleting=bool(metadata.get("deletionTimestamp")),
        status_reason=str((obj.get("status") or {}).get("reason", "")),
    )


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _version_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


# ---- retries --------------------------------------------------------------------------------


@dataclass
class Backoff:
    """Capped exponential delays with jitter: initial, initial*factor, ... up to cap, each scaled by 1 +- jitter."""

    initial: float = 0.5
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        """The delay before the next try; each call makes the following one longer, up to cap."""
        base = min(self.cap, self.initial * self.factor**self.attempt)
        self.attempt += 1
        return min(self.cap, base * self.rng.uniform(1 - self.jitter, 1 + self.jitter))

    def reset(self) -> None:
        """Start again from the initial delay (after a success)."""
        self.attempt = 0

    async def sleep(self) -> None:
        """Wait the next delay."""
        await asyncio.sleep(self.next_delay())

    async def retry(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        attempts: int | None = None,
        errors: OncePerError | None = None,
        retry_if: Callable[[KubeError], bool] = lambda error: error.transient,
    ) -> T:
        """call() until it succeeds; transient KubeErrors are retried (at most attempts tries; None: forever).

        Each distinct failure is logged once (through errors, or at WARNING here); a KubeError that
        retry_if rejects, or the last one when the attempts are spent, is raised.
        """
        errors = errors or OncePerError(log, logging.WARNING)
        tries = 0
        while True:
            tries += 1
            try:
                result = await call()
            except KubeError as error:
                if not retry_if(error) or (attempts is not None and tries >= attempts):
                    raise
                errors.failed("%s (retrying)", error.message)
                await self.sleep()
                continue
            errors.succeeded("API server answering again")
            self.reset()
            return result


# ---- the facade -----------------------------------------------------------------------------


async def connect(settings: KubeSettings) -> Kube:
    """A Kube for settings; makes no request (the API server may be down now). KubeConfigError when unusable."""
    import lightkube

    config = _client_config(settings)
    try:
        client = lightkube.AsyncClient(config, namespace=settings.namespace, timeout=_http_timeout(settings.timeout))
    except Exception as error:  # the library checks the config by using it (an assert for a missing user)
        raise KubeConfigError(f"cannot use {settings.source}: {str(error) or type(error).__name__}") from None
    return Kube(client, settings)


def _http_timeout(seconds: float) -> Any:
    import httpx2

    return httpx2.Timeout(seconds)


def _client_config(settings: KubeSettings) -> KubeConfig:
    from lightkube import KubeConfig
    from lightkube.config.models import Cluster, User

    if settings.in_cluster is not None:
        account = settings.in_cluster
        return KubeConfig.from_one(
            cluster=Cluster(server=account.server, certificate_auth=str(account.ca_file)),
            user=User(token_file=str(account.token_file)),
            namespace=settings.namespace,
        )
    assert settings.kubeconfig is not None
    try:
        config = KubeConfig.from_file(settings.kubeconfig)
        config.get()  # the current context must exist
    except Exception as error:  # the library checks a file's shape by using it: any failure means a bad file
        raise KubeConfigError(f"kubeconfig {settings.kubeconfig}: {str(error) or type(error).__name__}") from None
    return config


@cache
def _resource(kind: ObjectKind) -> Any:
    """The client library's generic (dict) resource class for kind; not registered, so it clashes with nothing."""
    from lightkube.generic_resource import GenericGlobalResource, GenericNamespacedResource, create_api_info

    base = GenericNamespacedResource if kind.namespaced else GenericGlobalResource
    api_info = create_api_info(kind.group, kind.version, kind.kind, kind.plural)
    return type(kind.kind, (base,), {"_api_info": api_info})


def _as_dict(obj: Any) -> Object:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


class Kube:
    """The API calls the features make; each has a deadline and raises KubeError."""

    def __init__(self, client: AsyncClient, settings: KubeSettings) -> None:
        self._client = client
        self.settings = settings
        self.timeout = settings.timeout

    @property
    def node_name(self) -> str:
        """The node this plugin runs on."""
        return self.settings.node_name

    @property
    def namespace(self) -> str:
        """The namespace this plugin runs in."""
        return self.settings.namespace

    async def close(self) -> None:
        """Close the connections."""
        with contextlib.suppress(Exception):
            await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # ---- ConfigMaps ------------------------------------------------------------------------

    async def get_config_map(self, namespace: str, name: str) -> ConfigMapDoc | None:
        """The ConfigMap, or None when there is none."""
        obj = await self.get_object(CONFIG_MAP, name, namespace)
        return None if obj is None else config_map_doc(obj)

    async def create_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> ConfigMapDoc:
        """Create the ConfigMap; KubeAlreadyExists when one of that name exists."""
        obj = {"metadata": {"name": name, "namespace": namespace}, "data": dict(data)}
        return config_map_doc(await self.create_object(CONFIG_MAP, obj))

    async def replace_config_map(
        self, namespace: str, name: str, data: Mapping[str, str], resource_version: str
    ) -> ConfigMapDoc:
        """Replace the ConfigMap's data if it is still at resource_version; KubeConflict when it changed since."""
        metadata = {"name": name, "namespace": namespace, "resourceVersion": resource_version}
        return config_map_doc(await self.replace_object(CONFIG_MAP, {"metadata": metadata, "data": dict(data)}))

    async def patch_config_map_data(self, namespace: str, name: str, data: Mapping[str, str | None]) -> ConfigMapDoc:
        """Set these keys of the ConfigMap's data (a merge patch; None removes a key); the others stay."""
        patched = await self._patch(CONFIG_MAP, name, namespace, {"data": dict(data)})
        return config_map_doc(patched)

    # ---- pods ------------------------------------------------------------------------------

    async def list_pods(
        self,
        namespace: str | None = None,
        *,
        field_selector: Mapping[str, str] | None = None,
        label_selector: Mapping[str, str] | None = None,
    ) -> list[PodDoc]:
        """Pods of namespace (None: every namespace) whose fields and labels equal the selectors'."""
        objects = await self.list_objects(POD, namespace, field_selector=field_selector, label_selector=label_selector)
        return [pod_doc(obj) for obj in objects]

    async def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> PodDoc:
        """Set these annotations of the pod (a merge patch; None removes one); the others stay."""
        patched = await self._patch(POD, name, namespace, {"metadata": {"annotations": dict(annotations)}})
        return pod_doc(patched)

    # ---- nodes -----------------------------------------------------------------------------

    async def get_node(self, name: str) -> dict[str, str]:
        """The node's labels; KubeNotFound when there is no such node."""
        return _labels(await self._get_node(name))

    async def _get_node(self, name: str) -> Object:
        obj = await self.get_object(NODE, name)
        if obj is None:
            raise KubeNotFound(f"get {NODE.describe(name)}: HTTP 404 NotFound: no such node", 404, "NotFound")
        return obj

    async def watch_node(self, name: str) -> AsyncIterator[dict[str, str]]:
        """The node's labels now, then each time they change; raises KubeError when the API server fails.

        A watch the server ends (or that falls silent) is resumed from the last resourceVersion seen;
        when that version is too old (410 Gone) the node is read again and watched from there. A deleted
        node yields {}.
        """
        node = await self._get_node(name)
        labels, version = _labels(node), _version_of(node)
        yield labels
        while True:
            try:
                async with contextlib.aclosing(self._watch_events(NODE, name, version)) as events:
                    async for change, obj in events:
                        version = _version_of(obj) or version
                        if change in ("ADDED", "MODIFIED", "DELETED"):
                            current = {} if change == "DELETED" else _labels(obj)
                            if current != labels:
                                labels = current
                                yield labels
            except _Expired:
                node = await self._get_node(name)
                version = _version_of(node)
                if _labels(node) != labels:
                    labels = _labels(node)
                    yield labels

    async def _watch_events(self, kind: ObjectKind, name: str, version: str) -> AsyncIterator[tuple[str, Object]]:
        """(event type, object) of a watch of one object from version, until the stream ends or falls silent."""
        import httpx2
        from lightkube import ApiError

        stream = self._client.watch(
            _resource(kind),
            fields={"metadata.name": name},
            resource_version=version or None,
            server_timeout=WATCH_SERVER_TIMEOUT,
        )
        what = f"watch {kind.describe(name)}"
        async with contextlib.aclosing(stream):
            while True:
                try:
                    async with asyncio.timeout(WATCH_SERVER_TIMEOUT + WATCH_IDLE_GRACE):
                        change, obj = await anext(stream)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    return  # silent past the server's own timeout: resumed by the caller
                except (ApiError, httpx2.HTTPStatusError) as error:
                    if _status_code(error) == _GONE:
                        raise _Expired from None
                    raise _kube_error(what, error) from None
                except Exception as error:
                    raise _kube_error(what, error) from None
                yield change, _as_dict(obj)

    # ---- any kind --------------------------------------------------------------------------

    async def get_object(self, kind: ObjectKind, name: str, namespace: str | None = None) -> Object | None:
        """The object as a dict, or None when there is none."""
        try:
            obj = await self._call(
                f"get {kind.describe(name, namespace)}",
                lambda: self._client.get(_resource(kind), name, **self._scope(kind, namespace)),
            )
        except KubeNotFound:
            return None
        return _as_dict(obj)

    async def list_objects(
        self,
        kind: ObjectKind,
        namespace: str | None = None,
        *,
        field_selector: Mapping[str, str] | None = None,
        label_selector: Mapping[str, str] | None = None,
    ) -> list[Object]:
        """Objects of kind (in namespace; None: every namespace) whose fields and labels equal the selectors'."""
        from lightkube import ALL_NS

        scope = {"namespace": namespace or ALL_NS} if kind.namespaced else {}
        where = f"in {namespace}" if namespace else "in every namespace" if kind.namespaced else ""

        async def listed() -> list[Object]:
            listing = self._client.list(
                _resource(kind),
                fields=dict(field_selector) if field_selector else None,
                labels=dict(label_selector) if label_selector else None,
                **scope,
            )
            return [_as_dict(obj) async for obj in listing]

        return await self._call(f"list {kind.plural} {where}".rstrip(), listed)

    async def create_object(self, kind: ObjectKind, obj: Mapping[str, Any]) -> Object:
        """Create obj (its namespace is metadata.namespace); the object as stored. KubeAlreadyExists when taken."""
        body = self._body(kind, obj)
        name, namespace = self._name_of(body)
        created = await self._call(f"create {kind.describe(name, namespace)}", lambda: self._client.create(body))
        return _as_dict(created)

    async def replace_object(self, kind: ObjectKind, obj: Mapping[str, Any]) -> Object:
        """Replace the object with obj; KubeConflict when metadata.resourceVersion is not the stored one."""
        body = self._body(kind, obj)
        name, namespace = self._name_of(body)
        replaced = await self._call(f"replace {kind.describe(name, namespace)}", lambda: self._client.replace(body))
        return _as_dict(replaced)

    async def delete_object(self, kind: ObjectKind, name: str, namespace: str | None = None) -> None:
        """Delete the object; KubeNotFound when there is none."""
        await self._call(
            f"delete {kind.describe(name, namespace)}",
            lambda: self._client.delete(_resource(kind), name, **self._scope(kind, namespace)),
        )

    async def _patch(self, kind: ObjectKind, name: str, namespace: str | None, patch: Object) -> Object:
        from lightkube.types import PatchType

        patched = await self._call(
            f"patch {kind.describe(name, namespace)}",
            lambda: self._client.patch(
                _resource(kind), name, patch, patch_type=PatchType.MERGE, **self._scope(kind, namespace)
            ),
        )
        return _as_dict(patched)

    # ---- plumbing --------------------------------------------------------------------------

    def _scope(self, kind: ObjectKind, namespace: str | None) -> dict[str, str]:
        return {"namespace": namespace or self.namespace} if kind.namespaced else {}

    def _body(self, kind: ObjectKind, obj: Mapping[str, Any]) -> Any:
        body = {**obj, "apiVersion": kind.api_version, "kind": kind.kind}
        metadata = dict(body.get("metadata") or {})
        if kind.namespaced:
            metadata.setdefault("namespace", self.namespace)
        body["metadata"] = metadata
        return _resource(kind)(body)

    @staticmethod
    def _name_of(body: Mapping[str, Any]) -> tuple[str, str | None]:
        metadata = body.get("metadata") or {}
        return str(metadata.get("name", "")), metadata.get("namespace")

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """call() within the deadline, its failures as KubeError naming what."""
        try:
            async with asyncio.timeout(self.timeout):
                return await call()
        except TimeoutError:
            raise KubeError(f"{what}: no answer from the API server within {self.timeout:g}s") from None
        except Exception as error:
            raise _kube_error(what, error) from None


class _Expired(Exception):
    """A watch's resourceVersion is too old (410 Gone): read the object again."""


def _status_code(error: Exception) -> int | None:
    status = getattr(error, "status", None)
    code = getattr(status, "code", None)
    if isinstance(code, int):
        return code
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _where(error: Exception) -> str:
    try:
        url = error.request.url  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # a transport error raised before its request was set
        return ""
    return f" at {url.scheme}://{url.netloc.decode()}"


def _kube_error(what: str, error: Exception) -> KubeError:
    """error (from the client library or the transport) as a KubeError whose message starts with what."""
    import httpx2
    from lightkube import ApiError

    if isinstance(error, ApiError):
        code, reason = error.status.code, error.status.reason or ""
        text = f"{what}: HTTP {code} {reason}: {error.status.message or ''}".rstrip(": ")
        if code == 404:
            return KubeNotFound(text, code, reason)
        if code == 409:
            return (KubeAlreadyExists if reason == "AlreadyExists" else KubeConflict)(text, code, reason)
        return KubeError(text, code, reason)
    if isinstance(error, httpx2.HTTPStatusError):
        code = error.response.status_code
        return KubeError(f"{what}: HTTP {code} {error.response.reason_phrase}", code)
    detail = str(error) or type(error).__name__
    if isinstance(error, httpx2.ConnectError | httpx2.ConnectTimeout):
        return KubeError(f"{what}: cannot reach the API server{_where(error)}: {detail}")
    if isinstance(error, httpx2.TransportError):
        return KubeError(f"{what}: lost the connection to the API server{_where(error)}: {detail}")
    return KubeError(f"{what}: {type(error).__name__}: {error}")
