"""The API server stand-in's HTTP side: the real REST paths over real HTTP, and the switches tests turn."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from aiohttp import web

from ix_device_plugin.standins.apiserver import bodies
from ix_device_plugin.standins.apiserver.managedfields import Writer, manager_of
from ix_device_plugin.standins.apiserver.protocol import (
    CORE,
    RESOURCE_GROUP,
    RESOURCE_VERSIONS,
    TOKEN,
    Kind,
    Object,
    Recorded,
    StatusError,
    field_matcher,
    label_matcher,
    parse_subresource_path,
    status_object,
)
from ix_device_plugin.standins.apiserver.store import Store, Watch

BODY = web.RequestKey("body", object)  # the request's decoded JSON body


@dataclass
class SlowRequest:
    """The next `times` requests of method whose path holds path_part wait seconds before they are handled."""

    method: str
    path_part: str
    seconds: float
    times: int

    def matches(self, request: web.Request) -> bool:
        """True when request is one of these."""
        return request.method == self.method and self.path_part in request.path


class ApiServerStandIn(Store):
    """The API server for tests: start(), then point a client at `url` (or a kubeconfig from write_kubeconfig)."""

    def __init__(self, token: str = TOKEN, history: int = 1000, tls: tuple[Path, Path] | None = None) -> None:
        super().__init__(history)
        self.token = token
        self.tls = tls  # (certificate, key) files: serve https
        self.unavailable = False
        self.delay = 0.0  # seconds every answer waits
        self.watches_end: str | None = None  # "expired": every watch answered 410 at once; "at once": ended at once
        self.bodies: str | None = None  # one of bodies.KINDS: answers too large, compressed, or without end
        self.requests: list[Recorded] = []
        self.slow: list[SlowRequest] = []  # requests answered late (slow_down)
        self._transports: set[asyncio.BaseTransport] = set()
        self._watch_opened = asyncio.Event()  # set (and replaced) at each watch opened: wakes watching()
        self._watch_clients: dict[Watch, web.BaseRequest] = {}  # each open watch's request: is its client there?
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
        self.stop_collecting()
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

    def slow_down(self, method: str, path_part: str, seconds: float, times: int = 1) -> None:
        """Handle the next times requests of method whose path holds path_part only after seconds (the request is
        received, its effect comes late: a slow etcd, a slow admission webhook)."""
        self.slow.append(SlowRequest(method, path_part, seconds, times))

    def drop_watches(self) -> None:
        """End every open watch stream, as an API server does when it restarts or times a watch out; from now on
        they count as closed (watching() waits for the next ones)."""
        for watch in list(self._watches):
            watch.queue.put_nowait(None)
        self._watches.clear()
        self._watch_clients.clear()

    def open_watches(self, plural: str) -> int:
        """How many watches of plural ("pods", "resourceslices", ...) are open now, their clients still connected."""
        return sum(1 for watch, request in self._watch_clients.items() if watch.plural == plural and _there(request))

    async def watching(self, plural: str, count: int = 1, timeout: float = 5.0) -> None:
        """Return once count watches of plural ("pods", "nodes", "resourceslices", ...) are open: every change made
        from then on reaches them. A TimeoutError after timeout seconds names the watches open instead."""
        try:
            async with asyncio.timeout(timeout):
                while self.open_watches(plural) < count:
                    await self._watch_opened.wait()
        except TimeoutError:
            open_now = sorted(watch.plural for watch, request in self._watch_clients.items() if _there(request))
            raise TimeoutError(
                f"the API server stand-in: not {count} open watch(es) of {plural} within {timeout:g}s "
                f"(open: {open_now or 'none'})"
            ) from None

    def _opened(self, watch: Watch, request: web.BaseRequest) -> None:
        self._watches.add(watch)
        self._watch_clients[watch] = request
        self._watch_opened.set()
        self._watch_opened = asyncio.Event()

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
        if slow := next((s for s in self.slow if s.times > 0 and s.matches(request)), None):
            slow.times -= 1
            await asyncio.sleep(slow.seconds)
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
        namespace, kind, name, subresource = parse_subresource_path(group, rest)
        body = request[BODY]
        if subresource == "status" and name is not None and request.method == "PATCH":
            if not isinstance(body, dict):
                raise StatusError(400, "BadRequest", "the patch is not a JSON object")
            only_status = {"status": body.get("status"), "metadata": body.get("metadata") or {}}
            only_status["metadata"] = {k: v for k, v in only_status["metadata"].items() if k == "resourceVersion"}
            writer = _writer(request, subresource)
            patched = self._patch(kind, namespace or "", name, only_status, request.content_type, writer)
            return _json(_as_version(patched, request))
        if request.method == "GET" and request.query.get("watch") in ("true", "1"):
            if self.bodies == bodies.ENDLESS_EVENT:
                return await bodies.stream(request, b'{"type": "ADDED", "object": {"metadata": {"name": "')
            return await self._watch(request, kind, namespace, name)
        if request.method == "GET" and self.bodies in (bodies.ENDLESS, bodies.DECLARED, bodies.COMPRESSED):
            return await bodies.answer(request, self.bodies)
        dry_run, writer = request.query.get("dryRun") == "All", _writer(request)
        if name is None:
            if request.method == "GET":
                return _json(self._list(request, kind, namespace))
            if request.method == "POST":
                return _json(_as_version(self._create(kind, namespace, body, dry_run, writer), request), status=201)
        else:
            ns = namespace or ""
            handlers: dict[str, Callable[[], Object]] = {
                "GET": lambda: self._read(kind, ns, name),
                "PUT": lambda: self._replace(kind, ns, name, body, dry_run, writer),
                "PATCH": lambda: self._patch(kind, ns, name, body, request.content_type, writer),
                "DELETE": lambda: self._remove(kind, ns, name),
            }
            if request.method in handlers:
                return _json(_as_version(handlers[request.method](), request))
        raise StatusError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def _list(self, request: web.Request, kind: Kind, namespace: str | None) -> Object:
        items = [_as_version(obj, request) for obj in self.matching(kind, namespace, _selectors(request))]
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": _api_version(request),
            "metadata": {"resourceVersion": str(self._version)},
            "items": items,
        }

    async def _watch(
        self, request: web.Request, kind: Kind, namespace: str | None, name: str | None
    ) -> web.StreamResponse:
        matches = _selectors(request)
        if name is not None:
            by_name = matches
            matches = lambda obj: obj["metadata"]["name"] == name and by_name(obj)  # noqa: E731
        watch = Watch(kind.plural, namespace, matches)
        backlog = self._hostile_answer() or self._backlog(watch, request.query.get("resourceVersion", ""))
        if not any(event["type"] in (_END, "ERROR") for event in backlog):  # else it ends at once: never open
            self._opened(watch, request)  # before any await: no change falls between the backlog and the stream
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            response.enable_chunked_encoding()
            await response.prepare(request)
            timeout = float(request.query.get("timeoutSeconds") or 0) or None
            await self._stream(response, request, watch, backlog, timeout)
        finally:
            self._watches.discard(watch)
            self._watch_clients.pop(watch, None)
        return response

    async def _stream(
        self,
        response: web.StreamResponse,
        request: web.Request,
        watch: Watch,
        backlog: list[Object],
        timeout: float | None,
    ) -> None:
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(timeout):
                for event in backlog:
                    if event["type"] == _END:
                        return
                    await _send(response, event)
                    if event["type"] == "ERROR":
                        return
                while (change := await watch.queue.get()) is not None:
                    await _send(
                        response, {"type": change.type, "object": _as_version(copy.deepcopy(change.object), request)}
                    )
        with contextlib.suppress(ConnectionError):
            await response.write_eof()

    def _hostile_answer(self) -> list[Object]:
        """What a watch gets at once when the watches_end switch is on: a 410, or an end with no event."""
        if self.watches_end == "expired":
            message = f"too old resource version: {self._version} ({self._version + 1})"
            return [{"type": "ERROR", "object": status_object(410, "Expired", message)}]
        if self.watches_end == "at once":
            return [{"type": _END}]
        return []


_END = "END"  # not sent: ends a watch stream cleanly before any event


def _there(request: web.BaseRequest) -> bool:
    """Whether request's client is still connected: a watch whose client left stays registered until a write to it
    fails, but is no longer open."""
    return request.transport is not None and not request.transport.is_closing()


def _json(obj: Object, status: int = 200) -> web.Response:
    # Exactly "application/json", as kube-apiserver sends: clients compare the header whole.
    return web.Response(body=json.dumps(obj).encode(), status=status, headers={"Content-Type": "application/json"})


async def _send(response: web.StreamResponse, event: Object) -> None:
    await response.write(json.dumps(event).encode() + b"\n")


def _selectors(request: web.Request) -> Callable[[Object], bool]:
    fields = field_matcher(request.query.get("fieldSelector", ""))
    labels = label_matcher(request.query.get("labelSelector", ""))
    return lambda obj: fields(obj) and labels(obj)


def _writer(request: web.Request, subresource: str = "") -> Writer:
    """Who the request writes as: its fieldManager, else its user agent's program name (kube-apiserver's rule)."""
    manager = manager_of(request.query.get("fieldManager"), request.headers.get("User-Agent", ""))
    return Writer(manager, _api_version(request), subresource)


def _api_version(request: web.Request) -> str:
    if request.path.startswith("/apis/"):
        return f"{request.match_info['group']}/{request.match_info['version']}"
    return "v1"


def _as_version(obj: Object, request: web.Request) -> Object:
    obj["apiVersion"] = _api_version(request)
    return obj


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
