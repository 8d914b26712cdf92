"""The Kubernetes API facade: `connect` and `Kube`, the calls the features make, each with a deadline.

Only the features that need the API server use this module (GPU reset coordination, Volcano mode, the
per-node configuration label, DRA). The client library (lightkube) is imported when `connect` is called,
never when this module is imported, so plain device plugging never loads it.

Every `Kube` call has a deadline and raises `KubeError` (or a subclass) whose message names the verb, the
object and the HTTP status. Features retry through `runtime.backoff.Backoff` (transient failures only), so
API failures never take device plugging down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ix_device_plugin.apiserver.errors import (
    KubeError,
    KubeNotFound,
    kube_error,
)
from ix_device_plugin.apiserver.events import watch_events
from ix_device_plugin.apiserver.limits import LIST_CAP, OBJECT_CAP, capped, limit_responses
from ix_device_plugin.apiserver.objects import (
    CONFIG_MAP,
    EVENT,
    NODE,
    POD,
    ConfigMapDoc,
    Object,
    ObjectKind,
    PodDoc,
    as_dict,
    config_map_doc,
    labels_of,
    pod_doc,
    resource,
    status_resource,
)
from ix_device_plugin.apiserver.settings import KubeConfigError, KubeSettings

if TYPE_CHECKING:
    from lightkube import AsyncClient, KubeConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


# ---- the facade -----------------------------------------------------------------------------


async def connect(settings: KubeSettings) -> Kube:
    """A Kube for settings; makes no request (the API server may be down now). KubeConfigError when unusable."""
    import lightkube

    config = _client_config(settings)
    try:
        client = lightkube.AsyncClient(config, namespace=settings.namespace, timeout=_http_timeout(settings.timeout))
    except Exception as error:  # the library checks the config by using it (an assert for a missing user)
        raise KubeConfigError(f"cannot use {settings.source}: {str(error) or type(error).__name__}") from None
    limit_responses(client._client._client)  # the library's HTTP client: every answer read within a cap
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
        return labels_of(await self._get_node(name))

    async def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> dict[str, str]:
        """Set these labels of the node (a merge patch; None removes one), the others left; its labels after."""
        return labels_of(await self._patch(NODE, name, None, {"metadata": {"labels": dict(labels)}}))

    async def _get_node(self, name: str) -> Object:
        obj = await self.get_object(NODE, name)
        if obj is None:
            raise KubeNotFound(f"get {NODE.describe(name)}: HTTP 404 NotFound: no such node", 404, "NotFound")
        return obj

    # ---- events ----------------------------------------------------------------------------

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Create the Event (core/v1) in namespace; KubeAlreadyExists when its name is taken."""
        body = {**event, "metadata": {**(event.get("metadata") or {}), "namespace": namespace}}
        await self.create_object(EVENT, body)

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge patch into the Event (its count and lastTimestamp); KubeNotFound when it is gone (expired)."""
        await self._patch(EVENT, name, namespace, dict(patch))

    # ---- any kind --------------------------------------------------------------------------

    async def get_object(self, kind: ObjectKind, name: str, namespace: str | None = None) -> Object | None:
        """The object as a dict, or None when there is none."""
        try:
            obj = await self._call(
                f"get {kind.describe(name, namespace)}",
                lambda: self._client.get(resource(kind), name, **self._scope(kind, namespace)),
            )
        except KubeNotFound:
            return None
        return as_dict(obj)

    async def list_objects(
        self,
        kind: ObjectKind,
        namespace: str | None = None,
        *,
        field_selector: Mapping[str, str] | None = None,
        label_selector: Mapping[str, str] | None = None,
    ) -> list[Object]:
        """Objects of kind (in namespace; None: every namespace) whose fields and labels equal the selectors'."""
        objects, _ = await self.list_with_version(
            kind, namespace, field_selector=field_selector, label_selector=label_selector
        )
        return objects

    async def list_with_version(
        self,
        kind: ObjectKind,
        namespace: str | None = None,
        *,
        field_selector: Mapping[str, str] | None = None,
        label_selector: Mapping[str, str] | None = None,
    ) -> tuple[list[Object], str]:
        """The objects list_objects gives, and the resourceVersion of the list (to watch from)."""
        from lightkube import ALL_NS

        scope = {"namespace": namespace or ALL_NS} if kind.namespaced else {}
        where = f"in {namespace}" if namespace else "in every namespace" if kind.namespaced else ""

        async def listed() -> tuple[list[Object], str]:
            listing = self._client.list(
                resource(kind),
                fields=dict(field_selector) if field_selector else None,
                labels=dict(label_selector) if label_selector else None,
                **scope,
            )
            objects = [as_dict(obj) async for obj in listing]
            return objects, listing.resourceVersion

        return await self._call(f"list {kind.plural} {where}".rstrip(), listed, cap=LIST_CAP)

    def watch(
        self,
        kind: ObjectKind,
        version: str,
        *,
        namespace: str | None = None,
        field_selector: Mapping[str, str] | None = None,
    ) -> AsyncIterator[tuple[str, Object]]:
        """(event type, object) of one watch of kind from version (namespace None: every namespace), until the
        server ends it; raises KubeError (KubeExpired when version is too old)."""
        fields = dict(field_selector or {})
        if "metadata.name" in fields:
            what = f"watch {kind.describe(fields['metadata.name'], namespace)}"
        else:
            where = f" in {namespace}" if namespace else " in every namespace" if kind.namespaced else ""
            what = f"watch {kind.plural}{where}"
        if fields.keys() - {"metadata.name"}:
            what += f" ({','.join(f'{key}={value}' for key, value in fields.items() if key != 'metadata.name')})"
        return watch_events(self._client, kind, what, version, namespace=namespace, field_selector=fields)

    async def create_object(self, kind: ObjectKind, obj: Mapping[str, Any], *, dry_run: bool = False) -> Object:
        """Create obj (its namespace is metadata.namespace); the object as stored. KubeAlreadyExists when taken.

        dry_run: the server validates and admits obj and answers what it would store, and stores nothing.
        """
        body = self._body(kind, obj)
        name, namespace = self._name_of(body)
        what = f"create{' (dry run)' if dry_run else ''} {kind.describe(name, namespace)}"
        created = await self._call(what, lambda: self._client.create(body, dry_run=dry_run))
        return as_dict(created)

    async def replace_object(self, kind: ObjectKind, obj: Mapping[str, Any]) -> Object:
        """Replace the object with obj; KubeConflict when metadata.resourceVersion is not the stored one."""
        body = self._body(kind, obj)
        name, namespace = self._name_of(body)
        replaced = await self._call(f"replace {kind.describe(name, namespace)}", lambda: self._client.replace(body))
        return as_dict(replaced)

    async def delete_object(self, kind: ObjectKind, name: str, namespace: str | None = None) -> None:
        """Delete the object; KubeNotFound when there is none."""
        await self._call(
            f"delete {kind.describe(name, namespace)}",
            lambda: self._client.delete(resource(kind), name, **self._scope(kind, namespace)),
        )

    async def patch_status(self, kind: ObjectKind, name: str, namespace: str | None, patch: Object) -> Object:
        """Merge patch into the object's status subresource (a metadata.resourceVersion in it is a precondition:
        KubeConflict when the object changed since); the object as stored."""
        from lightkube.types import PatchType

        patched = await self._call(
            f"patch the status of {kind.describe(name, namespace)}",
            lambda: self._client.patch(
                status_resource(kind), name, patch, patch_type=PatchType.MERGE, **self._scope(kind, namespace)
            ),
        )
        return as_dict(patched)

    async def _patch(self, kind: ObjectKind, name: str, namespace: str | None, patch: Object) -> Object:
        from lightkube.types import PatchType

        patched = await self._call(
            f"patch {kind.describe(name, namespace)}",
            lambda: self._client.patch(
                resource(kind), name, patch, patch_type=PatchType.MERGE, **self._scope(kind, namespace)
            ),
        )
        return as_dict(patched)

    # ---- plumbing --------------------------------------------------------------------------

    def _scope(self, kind: ObjectKind, namespace: str | None) -> dict[str, str]:
        return {"namespace": namespace or self.namespace} if kind.namespaced else {}

    def _body(self, kind: ObjectKind, obj: Mapping[str, Any]) -> Any:
        body = {**obj, "apiVersion": kind.api_version, "kind": kind.kind}
        metadata = dict(body.get("metadata") or {})
        if kind.namespaced:
            metadata.setdefault("namespace", self.namespace)
        body["metadata"] = metadata
        return resource(kind)(body)

    @staticmethod
    def _name_of(body: Mapping[str, Any]) -> tuple[str, str | None]:
        metadata = body.get("metadata") or {}
        name = metadata.get("name") or (f"{metadata['generateName']}*" if metadata.get("generateName") else "")
        return str(name), metadata.get("namespace")

    async def _call(self, what: str, call: Callable[[], Awaitable[T]], cap: int = OBJECT_CAP) -> T:
        """call() within the deadline, its answers within cap bytes, its failures as KubeError naming what."""
        try:
            with capped(cap):
                async with asyncio.timeout(self.timeout):
                    return await call()
        except TimeoutError:
            raise KubeError(f"{what}: no answer from the API server within {self.timeout:g}s") from None
        except Exception as error:
            raise kube_error(what, error) from None
