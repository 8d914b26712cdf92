"""How much of the API server's answers the agent reads: every body is capped, counted as it streams in.

The API server is another process; what it answers is read within a cap, or refused with a KubeError that
names what was asked and the cap:
- one object (a GET, or the object a write returns): OBJECT_CAP; etcd keeps objects of at most 1.5 MiB;
- a list (all its pages together): LIST_CAP; the node's pods, 110 by default and a few hundred at most, are
  a few MiB even with large annotations and managed fields (500 pods of 30 KB each fit);
- a watch: each event (one line, one object) WATCH_EVENT_CAP, for as long as the watch lives.
Decoded, an answer takes about 3.5 times its size in memory, so that the caps keep the agent under 150 MB.
A declared Content-Length over the cap is refused before any of the body is read. Answers are asked for
uncompressed (`Accept-Encoding: identity`, which kube-apiserver honours), so that what is counted is what is
kept; a compressed answer is refused, since a small one can inflate a thousand times.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx2

MIB = 1024 * 1024
OBJECT_CAP = 4 * MIB
LIST_CAP = 16 * MIB
WATCH_EVENT_CAP = 4 * MIB


class ResponseTooLarge(Exception):
    """An answer over its cap (or compressed); the message says which cap and how it was found out."""


@dataclass
class Cap:
    """The bytes one call may read: in all, or (per_line) between two newlines."""

    limit: int
    per_line: bool = False
    used: int = 0

    def declared(self, length: int) -> None:
        """Refuse an answer whose Content-Length would take the call past its cap."""
        if not self.per_line and self.used + length > self.limit:
            raise ResponseTooLarge(
                f"the API server's answer is {length:,} bytes (Content-Length), over the {_size(self.limit)} "
                "allowed; refused unread"
            )

    def add(self, chunk: bytes) -> None:
        """Count chunk; ResponseTooLarge once past the cap."""
        end = chunk.rfind(b"\n") if self.per_line else -1
        self.used = len(chunk) - end - 1 if end >= 0 else self.used + len(chunk)
        if self.used > self.limit:
            what = "one event of the watch is" if self.per_line else "the API server's answer is"
            raise ResponseTooLarge(f"{what} over the {_size(self.limit)} allowed; refused after reading that much")


_CAP: ContextVar[Cap | None] = ContextVar("ix_api_response_cap", default=None)


@contextlib.contextmanager
def capped(limit: int, *, per_line: bool = False) -> Iterator[Cap]:
    """Within this block, the answers of the current task share one cap of limit bytes."""
    cap = Cap(limit, per_line)
    token = _CAP.set(cap)
    try:
        yield cap
    finally:
        _CAP.reset(token)


def limit_responses(client: httpx2.AsyncClient) -> None:
    """Make every answer client reads count against the cap in force (OBJECT_CAP outside any `capped`)."""
    client.headers["Accept-Encoding"] = "identity"
    client.event_hooks = {**client.event_hooks, "response": [*client.event_hooks.get("response", []), _check]}


async def _check(response: httpx2.Response) -> None:
    """Before the body is read: refuse a compressed or declared-too-large one, then count the rest as it comes."""
    cap = _CAP.get() or Cap(OBJECT_CAP)
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ResponseTooLarge(f"the API server's answer is compressed ({encoding}) although none was asked for")
    length = response.headers.get("Content-Length", "")
    if length.isdigit():
        cap.declared(int(length))
    response.stream = _counted()(response.stream, cap)


@functools.cache
def _counted() -> type:
    """The counting stream class (made at first use: the HTTP library is imported only by the features using it)."""
    import httpx2

    class Counted(httpx2.AsyncByteStream):
        """A response body stream that counts what it gives against a cap."""

        def __init__(self, stream: Any, cap: Cap) -> None:
            self._stream = stream
            self._cap = cap

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self._stream:
                self._cap.add(chunk)
                yield chunk

        async def aclose(self) -> None:
            await self._stream.aclose()

    return Counted


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit % MIB == 0 else f"{limit:,} bytes"
