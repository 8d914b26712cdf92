"""A stand-in for the Kubernetes API server: real HTTP on 127.0.0.1, the real REST paths, an in-memory store.

It answers the paths and semantics the plugin's features use, as kube-apiserver does:
- core v1 `configmaps`, `pods` (namespaced, and `/api/v1/pods` across namespaces) and `nodes`;
- `resource.k8s.io` `resourceslices` (cluster-scoped) and `resourceclaims` (namespaced) under `v1`,
  `v1beta1` and `v1beta2`, all versions sharing one store;
- GET (one object or a list, with `fieldSelector` and `labelSelector`), POST (201, or 409 AlreadyExists),
  PUT (409 Conflict when `metadata.resourceVersion` is stale), PATCH (merge patch and strategic merge
  patch; lists are replaced whole, which is what strategic merge does for the fields used here), DELETE;
- `?watch=true` on a collection (or on `/api/v1/nodes/{name}`): chunked JSON lines
  `{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}` resuming after `resourceVersion`, an
  ERROR event with a 410 Expired status when that version is older than the history kept, `timeoutSeconds`;
- errors as `kind: Status` objects with `reason` and `code`; one global resourceVersion counter;
- a bearer token (401 without it).

Switches for tests: `unavailable` (every request answered 503), `delay` (seconds before every answer),
`refuse()`/`accept()` (the port stops and starts listening; open connections are cut), `drop_watches()`,
`compact()` (forget the history so old versions get 410). `requests` records every request.
`write_kubeconfig()` writes a kubeconfig pointing at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import socket
import ssl
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from aiohttp import web

TOKEN = "standin-token"
CORE = ""
RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSIONS = ("v1", "v1beta1", "v1beta2")
FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase")
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

Object = dict[str, Any]
BODY = web.RequestKey("body", object)  # the request's decoded JSON body


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


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the server -----------------------------------------------------------------------------


@dataclass(eq=False)
class _Watch:
    plural: str
    namespace: str | None
    matches: Callable[[Object], bool]
    queue: asyncio.Queue[Change | None] = field(default_factory=asyncio.Queue)


class ApiServerStandIn:
    """The API server for tests: start(), then point a client at `url` (or a kubeconfig from write_kubeconfig)."""

    def __init__(self, token: str = TOKEN, history: int = 1000, tls: tuple[Path, Path] | None = None) -> None:
        self.token = token
        self.tls = tls  # (certificate, key) files: serve https
        self.history_limit = history
        self.unavailable = False
        self.delay = 0.0  # seconds every answer waits
        self.device_taints = True  # False: ResourceSlice device taints are dropped on write (DRADeviceTaints off)
        self.requests: list[Recorded] = []
        self._objects: dict[tuple[str, str, str], Object] = {}  # (plural, namespace or "", name) -> object
        self._history: list[Change] = []
        self._oldest_kept = 0  # versions at or below this are gone from the history
        self._version = 0
        self._watches: set[_Watch] = set()
        self._transports: set[asyncio.BaseTransport] = set()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0

    # ---- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on 127.0.0.1 on a free port."""
        app = web.Application(middlewares=[self._middleware])
        app.router.add_route("*", "/api/{version}/{rest:.*}", self._core)
        app.router.add_route("*", "/apis/{group}/{version}/{rest:.*}", self._grouped)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        self.port = _free_port()
        await self.accept()

    async def stop(self) -> None:
        """Stop listening, end every watch and close every connection."""
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._site = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """The server's address for a client."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def refuse(self) -> None:
        """ "API server down": stop listening, end the watches and cut every open connection."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        self.drop_watches()
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()

    async def accept(self) -> None:
        """Listen again on the same port."""
        assert self._runner is not None, "start() first"
        if self._site is None:
            self._site = web.TCPSite(
                self._runner, "127.0.0.1", self.port, reuse_address=True, ssl_context=self._ssl_context()
            )
            await self._site.start()

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*self.tls)
        return context

    def drop_watches(self) -> None:
        """End every open watch stream, as an API server does when it restarts or times a watch out."""
        for watch in list(self._watches):
            watch.queue.put_nowait(None)

    def compact(self) -> None:
        """Forget the watch history: a watch from any version seen so far gets 410 Expired."""
        self._history.clear()
        self._oldest_kept = self._version

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig file pointing at this server (http, or https trusting its certificate) with the bearer token."""
        cluster: Object = {"server": self.url}
        if self.tls is not None:
            cluster["certificate-authority"] = str(self.tls[0])
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": cluster}],
            "users": [{"name": "standin", "user": {"token": self.token}}],
            "contexts": [
                {"name": "standin", "context": {"cluster": "standin", "user": "standin", "namespace": namespace}}
            ],
            "current-context": "standin",
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    # ---- the store, for tests --------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The last resourceVersion given out."""
        return self._version

    def get(self, plural: str, name: str, namespace: str = "") -> Object | None:
        """A copy of a stored object, or None."""
        obj = self._objects.get((plural, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def objects(self, plural: str) -> list[Object]:
        """Copies of every stored object of a kind."""
        return [copy.deepcopy(obj) for (kind, _, _), obj in sorted(self._objects.items()) if kind == plural]

    def put(self, plural: str, obj: Object) -> Object:
        """Store obj (created or replaced without checks) and tell the watches; the stored copy."""
        kind = next(kind for kind in KINDS if kind.plural == plural)
        metadata = obj.setdefault("metadata", {})
        namespace = metadata.get("namespace", "") if kind.namespaced else ""
        key = (plural, namespace, metadata["name"])
        existing = self._objects.get(key)
        if existing is not None:
            metadata.setdefault("uid", existing["metadata"]["uid"])
            metadata.setdefault("creationTimestamp", existing["metadata"]["creationTimestamp"])
        return self._store(kind, obj, "MODIFIED" if existing is not None else "ADDED")

    def delete(self, plural: str, name: str, namespace: str = "") -> Object:
        """Delete a stored object (a DELETED event); the object as it was."""
        kind = next(kind for kind in KINDS if kind.plural == plural)
        return self._delete(kind, namespace if kind.namespaced else "", name)

    def add_node(self, name: str, labels: Mapping[str, str] | None = None) -> Object:
        """Store a node with labels."""
        return self.put(
            "nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})}}
        )

    def set_node_labels(self, name: str, labels: Mapping[str, str]) -> Object:
        """Replace a node's labels (a MODIFIED event)."""
        node = self.get("nodes", name)
        assert node is not None, f"no node {name}"
        node["metadata"]["labels"] = dict(labels)
        return self.put("nodes", node)

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        phase: str = "Running",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        limits: Mapping[str, Mapping[str, str]] | None = None,
    ) -> Object:
        """Store a pod bound to node; limits maps a container name to its resource limits."""
        containers = [
            {"name": container, "resources": {"limits": dict(limit)}} for container, limit in (limits or {}).items()
        ]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": dict(labels or {}),
                "annotations": dict(annotations or {}),
            },
            "spec": {"nodeName": node, "containers": containers or [{"name": "main"}]},
            "status": {"phase": phase},
        }
        return self.put("pods", pod)

    def _store(self, kind: Kind, obj: Object, change: str) -> Object:
        self._version += 1
        metadata = obj["metadata"]
        metadata["resourceVersion"] = str(self._version)
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", _now())
        if kind.namespaced:
            metadata.setdefault("namespace", "default")
        else:
            metadata.pop("namespace", None)
        obj.setdefault("kind", kind.kind)
        key = (kind.plural, metadata.get("namespace", ""), metadata["name"])
        self._objects[key] = copy.deepcopy(obj)
        self._changed(kind.plural, change, obj)
        return copy.deepcopy(obj)

    def _delete(self, kind: Kind, namespace: str, name: str) -> Object:
        obj = self._objects.pop((kind.plural, namespace, name))
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self._changed(kind.plural, "DELETED", obj)
        return obj

    def _changed(self, plural: str, change_type: str, obj: Object) -> None:
        change = Change(self._version, plural, change_type, copy.deepcopy(obj))
        self._history.append(change)
        if len(self._history) > self.history_limit:
            dropped = self._history.pop(0)
            self._oldest_kept = dropped.resource_version
        for watch in self._watches:
            if _watch_wants(watch, change):
                watch.queue.put_nowait(change)

    # ---- HTTP ------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        if request.transport is not None:
            self._transports.add(request.transport)
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
        request[BODY] = body
        self.requests.append(Recorded(request.method, request.path, dict(request.query), request.content_type, body))
        if self.delay:
            await asyncio.sleep(self.delay)
        try:
            if self.unavailable:
                raise StatusError(503, "ServiceUnavailable", "the server is currently unable to handle the request")
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                raise StatusError(401, "Unauthorized", "Unauthorized")
            return await handler(request)
        except StatusError as error:
            return _json(error.status(), status=error.code)

    async def _core(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["version"] != "v1":
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        return await self._dispatch(request, CORE, request.match_info["rest"])

    async def _grouped(self, request: web.Request) -> web.StreamResponse:
        group, version = request.match_info["group"], request.match_info["version"]
        if group != RESOURCE_GROUP or version not in RESOURCE_VERSIONS:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        return await self._dispatch(request, group, request.match_info["rest"])

    async def _dispatch(self, request: web.Request, group: str, rest: str) -> web.StreamResponse:
        namespace, kind, name = _parse_path(group, rest)
        body = request[BODY]
        if request.method == "GET" and request.query.get("watch") in ("true", "1"):
            return await self._watch(request, kind, namespace, name)
        if name is None:
            if request.method == "GET":
                return _json(self._list(request, kind, namespace))
            if request.method == "POST":
                return _json(self._create(kind, namespace, body), status=201)
        else:
            ns = namespace or ""
            handlers: dict[str, Callable[[], Object]] = {
                "GET": lambda: self._read(kind, ns, name),
                "PUT": lambda: self._replace(kind, ns, name, body),
                "PATCH": lambda: self._patch(kind, ns, name, body, request.content_type),
                "DELETE": lambda: self._remove(kind, ns, name),
            }
            if request.method in handlers:
                return _json(_as_version(handlers[request.method](), request))
        raise StatusError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def _list(self, request: web.Request, kind: Kind, namespace: str | None) -> Object:
        matches = _selectors(request)
        items = [
            _as_version(copy.deepcopy(obj), request)
            for (plural, ns, _), obj in sorted(self._objects.items())
            if plural == kind.plural and (namespace is None or ns == namespace) and matches(obj)
        ]
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": _api_version(request),
            "metadata": {"resourceVersion": str(self._version)},
            "items": items,
        }

    def _read(self, kind: Kind, namespace: str, name: str) -> Object:
        obj = self._objects.get((kind.plural, namespace, name))
        if obj is None:
            raise not_found(kind, name)
        return copy.deepcopy(obj)

    def _create(self, kind: Kind, namespace: str | None, body: Any) -> Object:
        obj = _object_body(body)
        metadata = obj.setdefault("metadata", {})
        if "name" not in metadata and "generateName" in metadata:
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        name = metadata.get("name")
        if not name:
            raise StatusError(
                422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required value: name is required"
            )
        if kind.namespaced:
            if namespace is None:
                raise StatusError(405, "MethodNotAllowed", "create needs a namespace in the path")
            metadata["namespace"] = namespace
        if (kind.plural, namespace or "", name) in self._objects:
            raise StatusError(
                409, "AlreadyExists", f'{kind.plural} "{name}" already exists', {"name": name, "kind": kind.plural}
            )
        for server_field in ("resourceVersion", "uid", "creationTimestamp"):
            metadata.pop(server_field, None)
        return self._store(kind, self._admitted(kind, obj), "ADDED")

    def _replace(self, kind: Kind, namespace: str, name: str, body: Any) -> Object:
        current = self._read(kind, namespace, name)
        obj = _object_body(body)
        metadata = obj.setdefault("metadata", {})
        if metadata.get("name", name) != name:
            raise StatusError(
                400,
                "BadRequest",
                f"the name of the object ({metadata['name']}) does not match the name on the URL ({name})",
            )
        metadata["name"] = name
        wanted = metadata.get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise StatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": name, "kind": kind.plural},
            )
        metadata["uid"] = current["metadata"]["uid"]
        metadata["creationTimestamp"] = current["metadata"]["creationTimestamp"]
        if kind.namespaced:
            metadata["namespace"] = namespace
        return self._store(kind, self._admitted(kind, obj), "MODIFIED")

    def _admitted(self, kind: Kind, obj: Object) -> Object:
        """obj as the API server keeps it: without device taints when they are off."""
        if kind.plural == "resourceslices" and not self.device_taints:
            for device in (obj.get("spec") or {}).get("devices") or []:
                device.pop("taints", None)
        return obj

    def _patch(self, kind: Kind, namespace: str, name: str, body: Any, content_type: str) -> Object:
        current = self._read(kind, namespace, name)
        if content_type not in (MERGE_PATCH, STRATEGIC_PATCH):
            raise StatusError(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
            )
        if not isinstance(body, dict):
            raise StatusError(400, "BadRequest", "the patch is not a JSON object")
        patched = merge_patch(current, body)
        metadata = patched.setdefault("metadata", {})
        metadata["name"] = name
        metadata["uid"] = current["metadata"]["uid"]
        wanted = body.get("metadata", {}).get("resourceVersion") if isinstance(body.get("metadata"), dict) else None
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise StatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been modified',
            )
        return self._store(kind, patched, "MODIFIED")

    def _remove(self, kind: Kind, namespace: str, name: str) -> Object:
        self._read(kind, namespace, name)
        return self._delete(kind, namespace, name)

    async def _watch(
        self, request: web.Request, kind: Kind, namespace: str | None, name: str | None
    ) -> web.StreamResponse:
        matches = _selectors(request)
        if name is not None:
            by_name = matches
            matches = lambda obj: obj["metadata"]["name"] == name and by_name(obj)  # noqa: E731
        watch = _Watch(kind.plural, namespace, matches)
        backlog = self._backlog(watch, request.query.get("resourceVersion", ""))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        self._watches.add(watch)
        try:
            timeout = float(request.query.get("timeoutSeconds") or 0) or None
            await self._stream(response, request, watch, backlog, timeout)
        finally:
            self._watches.discard(watch)
        return response

    async def _stream(
        self,
        response: web.StreamResponse,
        request: web.Request,
        watch: _Watch,
        backlog: list[Object],
        timeout: float | None,
    ) -> None:
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(timeout):
                for event in backlog:
                    await _send(response, event)
                    if event["type"] == "ERROR":
                        return
                while (change := await watch.queue.get()) is not None:
                    await _send(
                        response, {"type": change.type, "object": _as_version(copy.deepcopy(change.object), request)}
                    )
        with contextlib.suppress(ConnectionError):
            await response.write_eof()

    def _backlog(self, watch: _Watch, since: str) -> list[Object]:
        """What a new watch is sent first: every matching object (no version), the changes after since, or 410."""
        if since in ("", "0"):
            return [
                {"type": "ADDED", "object": copy.deepcopy(obj)}
                for (plural, ns, _), obj in sorted(self._objects.items())
                if plural == watch.plural and (watch.namespace is None or ns == watch.namespace) and watch.matches(obj)
            ]
        try:
            version = int(since)
        except ValueError:
            raise StatusError(400, "BadRequest", f'invalid resource version: "{since}"') from None
        if version < self._oldest_kept:
            message = f"too old resource version: {version} ({self._oldest_kept + 1})"
            return [{"type": "ERROR", "object": status_object(410, "Expired", message)}]
        return [
            {"type": change.type, "object": copy.deepcopy(change.object)}
            for change in self._history
            if change.resource_version > version and _watch_wants(watch, change)
        ]

    def bookmark(self) -> None:
        """Send every open watch a BOOKMARK event carrying the current resourceVersion."""
        for watch in self._watches:
            kind = next(kind for kind in KINDS if kind.plural == watch.plural)
            obj = {"kind": kind.kind, "apiVersion": "v1", "metadata": {"resourceVersion": str(self._version)}}
            watch.queue.put_nowait(Change(self._version, watch.plural, "BOOKMARK", obj))


def _watch_wants(watch: _Watch, change: Change) -> bool:
    if change.plural != watch.plural:
        return False
    namespace = change.object.get("metadata", {}).get("namespace", "")
    return (watch.namespace is None or namespace == watch.namespace) and watch.matches(change.object)


def _json(obj: Object, status: int = 200) -> web.Response:
    # Exactly "application/json", as kube-apiserver sends: clients compare the header whole.
    return web.Response(body=json.dumps(obj).encode(), status=status, headers={"Content-Type": "application/json"})


async def _send(response: web.StreamResponse, event: Object) -> None:
    await response.write(json.dumps(event).encode() + b"\n")


def _selectors(request: web.Request) -> Callable[[Object], bool]:
    fields = field_matcher(request.query.get("fieldSelector", ""))
    labels = label_matcher(request.query.get("labelSelector", ""))
    return lambda obj: fields(obj) and labels(obj)


def _parse_path(group: str, rest: str) -> tuple[str | None, Kind, str | None]:
    """(namespace or None, kind, name or None) of the path after /api/v1 or /apis/<group>/<version>."""
    parts = [part for part in rest.split("/") if part]
    namespace: str | None = None
    if len(parts) >= 3 and parts[0] == "namespaces":
        namespace, parts = parts[1], parts[2:]
    if not parts or len(parts) > 2 or (group, parts[0]) not in _BY_PLURAL:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    kind = _BY_PLURAL[(group, parts[0])]
    name = parts[1] if len(parts) == 2 else None
    if namespace is not None and not kind.namespaced:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    if namespace is None and kind.namespaced and name is not None:
        raise StatusError(404, "NotFound", "the server could not find the requested resource")
    return namespace, kind, name


def _api_version(request: web.Request) -> str:
    if request.path.startswith("/apis/"):
        return f"{request.match_info['group']}/{request.match_info['version']}"
    return "v1"


def _as_version(obj: Object, request: web.Request) -> Object:
    obj["apiVersion"] = _api_version(request)
    return obj


def _object_body(body: Any) -> Object:
    if not isinstance(body, dict):
        raise StatusError(400, "BadRequest", "the body of the request is not a JSON object")
    return copy.deepcopy(body)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
