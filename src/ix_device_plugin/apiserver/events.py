"""One watch request and its events: exactly one request, whatever happens next is the caller's choice."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from ix_device_plugin.apiserver.errors import kube_error
from ix_device_plugin.apiserver.limits import WATCH_EVENT_CAP, capped
from ix_device_plugin.apiserver.objects import Object, ObjectKind, as_dict, resource

if TYPE_CHECKING:
    from lightkube import AsyncClient

WATCH_SERVER_TIMEOUT = 240  # the shortest time after which the API server is asked to end a watch; it is resumed
WATCH_IDLE_GRACE = 30.0  # a watch silent this long past the server timeout is presumed dead and resumed


def server_timeout() -> int:
    """The timeoutSeconds of one watch: drawn from [WATCH_SERVER_TIMEOUT, 2 * WATCH_SERVER_TIMEOUT), as client-go
    draws its own, so that the watches a fleet opened together (its start, an API server restart) do not all
    end and open again together every few minutes for good."""
    return random.randrange(WATCH_SERVER_TIMEOUT, 2 * WATCH_SERVER_TIMEOUT)


async def watch_events(
    client: AsyncClient,
    kind: ObjectKind,
    what: str,
    version: str,
    *,
    namespace: str | None = None,
    field_selector: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[str, Object]]:
    """(event type, object) of one watch request from version, until the stream ends or falls silent.

    Raises KubeError naming what (KubeExpired when version is older than the history the server keeps).
    Unlike the client library's own watch, which opens the next request at once whenever one ends, this
    makes exactly one request: what comes next, and when, is the caller's choice.
    """
    from lightkube import ALL_NS
    from lightkube.core.generic_client import WatchDriver

    generic = client._client  # the library's request layer: one request, not its endless re-opening loop
    timeout = server_timeout()
    params = {
        "timeoutSeconds": timeout,
        "resourceVersion": version or None,
        "allowWatchBookmarks": "true",
        "fieldSelector": ",".join(f"{key}={value}" for key, value in (field_selector or {}).items()) or None,
    }
    scope = (namespace or ALL_NS) if kind.namespaced else None
    try:
        request = generic.prepare_request("list", res=resource(kind), namespace=scope, watch=True, params=params)
        driver = WatchDriver(request, generic._client.build_request)
        with capped(WATCH_EVENT_CAP, per_line=True):  # the stream counts against it for as long as it lives
            response = await generic.send(driver.get_request(timeout=generic._watch_timeout), stream=True)
    except Exception as error:
        raise kube_error(what, error) from None
    try:
        try:
            response.raise_for_status()
            lines = response.aiter_lines()
        except Exception as error:
            raise kube_error(what, error) from None
        while True:
            try:
                async with asyncio.timeout(timeout + WATCH_IDLE_GRACE):
                    line = await anext(lines)
                change, obj = driver.process_one_line(line)
            except (StopAsyncIteration, TimeoutError):
                return  # ended by the server, or silent past its own timeout
            except Exception as error:
                raise kube_error(what, error) from None
            yield change, as_dict(obj)
    finally:
        with contextlib.suppress(Exception):
            await response.aclose()
