"""HTTP endpoint for kubelet probes and Prometheus: /healthz, /readyz, /metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.lazymetrics import CONTENT_TYPE as CONTENT_TYPE_LATEST
from ix_device_plugin.settings.values import parse_address as parse_address  # the address is a setting

log = logging.getLogger(__name__)

# (ok, reason) for a probe.
Check = Callable[[], tuple[bool, str]]


@dataclass(frozen=True)
class ProbeHandlers:
    """What each path answers."""

    live: Check
    ready: Check
    metrics: Callable[[], bytes]


_REQUEST_TIMEOUT = 5.0


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """The request line, after reading (and ignoring) the header lines that follow it."""
    request_line = await reader.readline()
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass
    return request_line


class ProbeServer:
    """A minimal HTTP/1.1 server on asyncio: GET only, one response per connection."""

    def __init__(self, handlers: ProbeHandlers) -> None:
        self._handlers = handlers
        self._server: asyncio.Server | None = None

    async def start(self, host: str | None, port: int) -> int:
        """Listen on host:port; returns the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)
        bound = self._server.sockets[0].getsockname()[1]
        log.info("probes and metrics on http://%s:%d (/healthz /readyz /metrics)", host or "*", bound)
        return int(bound)

    async def stop(self) -> None:
        """Stop listening and drop open connections."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(_REQUEST_TIMEOUT):
                    request_line = await _read_head(reader)
            except ValueError:  # a line longer than the stream's limit (64 KiB)
                status, content_type, body = "431 Request Header Fields Too Large", "text/plain", b"header too long\n"
            else:
                status, content_type, body = self._answer(request_line.decode("latin-1").split())
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    def _answer(self, parts: list[str]) -> tuple[str, str, bytes]:
        if len(parts) < 2 or parts[0] not in {"GET", "HEAD"}:
            return "405 Method Not Allowed", "text/plain", b"only GET is served\n"
        path = parts[1].split("?", 1)[0]
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, self._handlers.metrics()
        check = {
            "/healthz": self._handlers.live,
            "/livez": self._handlers.live,
            "/readyz": self._handlers.ready,
        }
        if path not in check:
            return "404 Not Found", "text/plain", b"not found: try /healthz, /readyz or /metrics\n"
        ok, reason = check[path]()
        status = "200 OK" if ok else "503 Service Unavailable"
        return status, "text/plain; charset=utf-8", f"{'ok' if ok else 'not ok'}: {reason}\n".encode()


async def start_probes(address: str, handlers: ProbeHandlers) -> tuple[ProbeServer, int] | None:
    """Serve handlers on address (`HOST:PORT`, `off`): the server and its port, None when off; StartupError."""
    parsed = parse_address(address)
    if parsed is None:
        return None
    server = ProbeServer(handlers)
    try:
        return server, await server.start(*parsed)
    except OSError as error:
        raise StartupError(f"cannot listen on --health-address {address}: {error}") from error
