"""Answers of an API server that means harm, one picked by the stand-in's `bodies` switch.

Bodies too large (declared, or streamed without end), compressed bodies nobody asked for, and watch events that
never end.
"""

from __future__ import annotations

import contextlib
import functools
import zlib

from aiohttp import web

MIB = 1024 * 1024
ENDLESS = "endless"  # GETs: a JSON body streamed on and on (up to STREAM_LIMIT), never finished
DECLARED = "declared"  # GETs: headers declaring DECLARED_SIZE bytes, and no body
COMPRESSED = "compressed"  # GETs: a small gzip body that inflates to INFLATED bytes
ENDLESS_EVENT = "endless event"  # watches: one event line that never ends (up to STREAM_LIMIT)
KINDS = (ENDLESS, DECLARED, COMPRESSED, ENDLESS_EVENT)
STREAM_LIMIT = 400 * MIB  # an endless body stops here, whoever still reads it
DECLARED_SIZE = 300 * 1000 * 1000
INFLATED = 64 * MIB
_CHUNK = b"x" * MIB


async def answer(request: web.Request, kind: str) -> web.StreamResponse:
    """The hostile answer of kind to a GET."""
    if kind == DECLARED:
        response = web.StreamResponse(
            headers={"Content-Type": "application/json", "Content-Length": str(DECLARED_SIZE)}
        )
        await response.prepare(request)
        return response
    if kind == COMPRESSED:
        body = _compressed(b'{"kind": "List", "items": [], "padding": "', INFLATED, b'"}')
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        return web.Response(body=body, headers=headers)
    return await stream(request, b'{"kind": "List", "apiVersion": "v1", "items": [{"metadata": {"name": "')


async def stream(request: web.Request, head: bytes) -> web.StreamResponse:
    """head, then one megabyte after another of the same byte, until the client leaves or STREAM_LIMIT."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        await response.write(head)
        for _ in range(STREAM_LIMIT // MIB):
            await response.write(_CHUNK)
    return response


@functools.cache
def _compressed(head: bytes, size: int, tail: bytes) -> bytes:
    """gzip of head, size bytes of padding and tail, made a megabyte at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip format
    parts = [packer.compress(head)]
    parts += [packer.compress(_CHUNK) for _ in range(size // MIB)]
    parts += [packer.compress(tail), packer.flush()]
    return b"".join(parts)
