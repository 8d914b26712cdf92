"""Watches: the changes to the objects a selector picks, from a resourceVersion on, as (event type, object)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from ix_device_plugin.apiserver.errors import kube_error
from ix_device_plugin.apiserver.objects import Object, ObjectKind, as_dict, resource

if TYPE_CHECKING:
    from lightkube import AsyncClient

WATCH_SERVER_TIMEOUT = 240  # seconds after which the API server ends a watch; it is resumed
WATCH_IDLE_GRACE = 30.0  # a watch silent this long past the server timeout is presumed dead and resumed


async def watch_events(
    client: AsyncClient,
    kind: ObjectKind,
    what: str,
    version: str,
    *,
    namespace: str | None = None,
    field_selector: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[str, Object]]:
    """(event type, object) of a watch from version, until the stream ends or falls silent.

    Raises KubeError naming what (KubeExpired when version is older than the history the server keeps).
    """
    scope = {"namespace": namespace} if kind.namespaced and namespace else {}
    stream = client.watch(
        resource(kind),
        fields=dict(field_selector) if field_selector else None,
        resource_version=version or None,
        server_timeout=WATCH_SERVER_TIMEOUT,
        **scope,
    )
    async with contextlib.aclosing(stream):
        while True:
            try:
                async with asyncio.timeout(WATCH_SERVER_TIMEOUT + WATCH_IDLE_GRACE):
                    change, obj = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError:
                return  # silent past the server's own timeout: resumed by the caller
            except Exception as error:
                raise kube_error(what, error) from None
            yield change, as_dict(obj)
