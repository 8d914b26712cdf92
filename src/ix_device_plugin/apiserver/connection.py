"""The one connection to the API server a process has: made on first use, shared by every feature, closed once.

Every feature that needs the API server (the node label, the GPU reset handshake, Volcano mode, DRA) asks
the same `ApiConnection` for its `Kube`. Nothing is imported or asked of the API server when it is made:
the client library is imported, and the client created, at the first `kube()`; the first request is the
caller's. Retries after a failure, and re-opened watches, wait out delays of the connection's one policy
(`backoff()`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from ix_device_plugin.apiserver.client import Kube, connect
from ix_device_plugin.apiserver.errors import KubeError
from ix_device_plugin.apiserver.settings import KubeSettings
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

T = TypeVar("T")


class ConnectionClosed(KubeError):
    """The connection was closed: the process is stopping; trying again cannot help."""

    @property
    def transient(self) -> bool:
        """Never: nothing opens a closed connection again."""
        return False


POLICY = Backoff(initial=0.5, cap=30.0)  # every retry against the API server: 0.5 s doubling up to 30 s, +-20 %


class ApiConnection:
    """The process's connection to the API server, for everything that needs one."""

    def __init__(self, settings: KubeSettings, policy: Backoff = POLICY) -> None:
        self.settings = settings
        self._policy = policy
        self._kube: Kube | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    @property
    def node_name(self) -> str:
        """The node this process runs for."""
        return self.settings.node_name

    @property
    def namespace(self) -> str:
        """The namespace this process runs in."""
        return self.settings.namespace

    def backoff(self) -> Backoff:
        """A new Backoff with the connection's policy, for one loop of retries."""
        return replace(self._policy, attempt=0, rng=random.Random())

    async def kube(self) -> Kube:
        """The client, created on first use (no request is made); KubeConfigError when the settings cannot be used.

        After close(), ConnectionClosed: the process is stopping.
        """
        async with self._opening:
            if self._closed:
                raise ConnectionClosed("the API connection is closed: the plugin is stopping")
            if self._kube is None:
                self._kube = await connect(self.settings)
                log.info("API server from %s, for node %s", self.settings.source, self.settings.node_name)
            return self._kube

    async def retry(
        self,
        call: Callable[[Kube], Awaitable[T]],
        *,
        attempts: int | None = None,
        errors: OncePerError | None = None,
    ) -> T:
        """call(kube) until it succeeds; transient API failures are tried again with the connection's policy.

        KubeConfigError (the settings are unusable) and failures that trying again cannot fix are raised.
        """

        async def attempt() -> T:
            return await call(await self.kube())

        return await self.backoff().retry(
            attempt, attempts=attempts, errors=errors, recovered="the API server answers again"
        )

    async def close(self) -> None:
        """Close the client, once; later calls to kube() fail."""
        async with self._opening:
            self._closed = True
            kube, self._kube = self._kube, None
        if kube is not None:
            await kube.close()
