"""Iluvatar's reset handshake with the other IXML users on the node, on the ConfigMap `ix-gpu-reset-<node>`.

We set `reset: true` and our `occupy` false, wait until every other `occupy` is false, reset, then set
`reset: false` and our `occupy` true, and wait for the others to come back. Unlike upstream:
- each step has a deadline, and `reset: true` is never left behind (`resetting` says it may stand);
- the others' entries are never dropped: when the ConfigMap must be made again, it is made with the
  entries last read;
- a ConfigMap deleted once it was seen calls the handshake off: no one can be asked to let go any more,
  so no reset happens (the caller refuses it); it is made again, with the entries last read, when the
  reset is called off;
- a user that let go and did not come back is remembered, and not waited for again until it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from ix_device_plugin.gpureset.document import CONFIG_MAP_PREFIX, DATA_KEY, ResetInfo
from ix_device_plugin.gpureset.outcome import GpuResetError

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.client import Kube
    from ix_device_plugin.apiserver.connection import ApiConnection

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.5
WRITE_ATTEMPTS = 5


async def open_handshake(api: ApiConnection, node: str) -> ResetHandshake:
    """The handshake on node's ConfigMap over the process's API connection; GpuResetError ("refused") when the
    connection cannot be made or is closed (the process stopping): no reset without asking the others."""
    from ix_device_plugin.apiserver.errors import KubeError
    from ix_device_plugin.apiserver.settings import KubeConfigError

    try:
        kube = await api.kube()
    except (KubeConfigError, KubeError) as error:
        raise GpuResetError(f"the reset handshake failed: {error}; the GPUs were not reset", "refused") from None
    return ResetHandshake(kube, api.namespace, node)


class ResetHandshake:
    """The handshake's steps on the ConfigMap; each one bounded, each failure leaving it as the others expect."""

    def __init__(self, kube: Kube, namespace: str, node: str, poll_interval: float = POLL_INTERVAL) -> None:
        self.kube = kube
        self.namespace = namespace
        self.node = node
        self.name = CONFIG_MAP_PREFIX + node
        self.poll_interval = poll_interval
        self.others: dict[str, bool] = {}  # the other users' entries as last read
        self.seen = False  # the ConfigMap was there when last read or written
        self.resetting = False  # reset: true may stand in the ConfigMap, until reset: false is written
        self.gone: set[str] = set()  # let go for a reset and did not come back: not waited for until they do

    @property
    def where(self) -> str:
        """The ConfigMap, for messages."""
        return f"ConfigMap {self.namespace}/{self.name}"

    async def announce(self, timeout: float) -> None:
        """Say reset: false and that we hold the GPUs (making the ConfigMap if there is none); others' entries stay."""
        async with self._bounded(timeout, "saying the plugin holds the GPUs"):
            await self._write(resetting=False, remake=True)
        self.resetting = False

    async def repair(self, timeout: float) -> bool:
        """Where the ConfigMap says reset: true (a reset cut short by a stop or a kill), say reset: false and that
        we hold the GPUs; nothing when there is none or it says reset: false. True when it was repaired."""
        async with self._bounded(timeout, "ending a GPU reset cut short"):
            info, _, _ = await self._read()
            if info is None or not info.reset:
                return False
            await self._write(resetting=False, remake=True)
        self.resetting = False
        return True

    async def hold_off(self, timeout: float) -> None:
        """Say reset: true and wait until no other user holds the GPUs; GpuResetError (nothing may be reset) naming
        who did not let go in time, or saying the ConfigMap was deleted (the handshake is off)."""
        deadline = time.monotonic() + timeout
        async with self._bounded(timeout, "asking the other IXML users to let go"):
            self.resetting = True
            written = await self._write(resetting=True, remake=False)
            info = await self._wait(lambda info: not info.holding(), deadline, remake=False, first=written)
        if info.holding():
            raise GpuResetError(
                f"{', '.join(info.holding())} did not let go of the GPUs within {timeout:g}s ({self.where}); "
                f"if it no longer runs on this node, remove its entry from the key {DATA_KEY}"
            )

    async def welcome_back(self, timeout: float) -> list[str]:
        """Say the reset is over and wait for the users that let go to take the GPUs back; those that did not.

        Users that did not come back after an earlier reset are not waited for again until they do.
        """
        deadline = time.monotonic() + timeout
        async with self._bounded(timeout, "handing the GPUs back"):
            written = await self._write(resetting=False, remake=True)
            self.resetting = False
            info = await self._wait(lambda info: not self._awaited(info), deadline, remake=True, first=written)
        late = self._awaited(info)
        self.gone.update(late)
        return late

    def _awaited(self, info: ResetInfo) -> list[str]:
        return [name for name in info.away() if name not in self.gone]

    def _bounded(self, timeout: float, step: str) -> contextlib.AbstractAsyncContextManager[None]:
        # The step's own waits end at timeout; the slack is for the API call under way then.
        return _within(timeout + self.kube.timeout, f"{self.where}: {step}")

    async def _read(self) -> tuple[ResetInfo | None, str | None, dict[str, str]]:
        """The document, its resourceVersion and the ConfigMap's data (None, None, {} when there is none)."""
        found = await self.kube.get_config_map(self.namespace, self.name)
        if found is None:
            return None, None, {}
        info = ResetInfo.parse(found.data.get(DATA_KEY), self.node, self.where)
        self.seen = True
        self._remember(info)
        return info, found.resource_version, dict(found.data)

    def _remember(self, info: ResetInfo) -> None:
        self.others = info.others()
        for name in sorted(self.gone):
            if self.others.get(name) is not False:
                self.gone.discard(name)
                log.info("%s took the GPUs back (%s); it is waited for again after a reset", name, self.where)

    async def _write(self, *, resetting: bool, remake: bool) -> ResetInfo:
        """Our part of the document; a missing ConfigMap is made again only when remake (never by asking for a reset).
        The document as it stands once written (read just before a write that no other write came between).

        GpuResetError when the ConfigMap was deleted and not remake, or it keeps changing under us.
        """
        from ix_device_plugin.apiserver.errors import KubeAlreadyExists, KubeConflict

        for _ in range(WRITE_ATTEMPTS):
            info, version, data = await self._read()
            if info is None and self.seen and not remake:
                raise self._deleted()
            written = (info or ResetInfo(self.node, occupy=dict(self.others))).ours(resetting=resetting)
            text = written.text()
            if version is not None and data.get(DATA_KEY) == text:
                return written  # already says so (a restart, an upgrade, a rollout): nothing to write
            try:
                if version is None:
                    await self.kube.create_config_map(self.namespace, self.name, {DATA_KEY: text})
                else:
                    await self.kube.replace_config_map(self.namespace, self.name, {**data, DATA_KEY: text}, version)
                self.seen = True
                return written
            except (KubeConflict, KubeAlreadyExists):
                continue  # someone else wrote in between: read again
        raise GpuResetError(f"{self.where} kept changing under us ({WRITE_ATTEMPTS} attempts)")

    async def _wait(
        self, done: Callable[[ResetInfo], bool], deadline: float, *, remake: bool, first: ResetInfo | None = None
    ) -> ResetInfo:
        """Poll the document until done(info) or the deadline; the last info read. A deleted ConfigMap is made
        again when remake, else GpuResetError. first: the document as just written, looked at before any read
        (a reset with no one to wait for costs no read)."""
        while True:
            info, first = (first, None) if first is not None else ((await self._read())[0], None)
            if info is None:
                if not remake:
                    raise self._deleted()
                await self._write(resetting=False, remake=True)
                continue
            if done(info) or time.monotonic() >= deadline:
                return info
            await asyncio.sleep(self.poll_interval)

    def _deleted(self) -> GpuResetError:
        holding = sorted(name for name, held in self.others.items() if held)
        who = f"{', '.join(holding)} (holding the GPUs when last read)" if holding else "the other IXML users"
        return GpuResetError(
            f"{self.where} was deleted during the reset handshake: it is off, {who} cannot be asked to let go",
            "refused",
        )


@contextlib.asynccontextmanager
async def _within(seconds: float, step: str) -> AsyncIterator[None]:
    """The step within seconds, else GpuResetError naming it."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise GpuResetError(f"{step} took longer than {seconds:g}s", "refused") from None
