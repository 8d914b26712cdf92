"""Which pod of the driver publishes the node's ResourceSlices: one at a time, the holder of a file lock,
`<plugins dir>/gpu.iluvatar.com/publisher.lock`, which every pod of the driver mounts.

During a rolling update the new pod finds the lock held and waits on standby: it serves the kubelet (prepares,
unprepares, health) but writes no slice, so the two never take each other's writes for foreign edits. The old
pod lets go as soon as its publisher has stopped (at SIGTERM), or the kernel lets go when it dies (kill -9, OOM);
the standby notices within POLL and publishes its own content from then on.

A node-local lock rather than a coordination.k8s.io Lease: it costs the API server nothing (a Lease renewed by
every node is a write per node every few seconds at fleet scale), it is handed over within POLL instead of a
lease duration, and it does not depend on the API server (a node that lost it keeps its one publisher). A pod
wedged while holding the lock keeps it, as it would keep renewing a Lease from a live loop; its liveness probe
and the update's deletion of the old pod end it, and the kernel lets go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.locks import FileLock, LockError
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

ROLE_FILE = "publisher.lock"
POLL = 0.1  # seconds between looks at a lock another pod holds: the longest a handover waits
CHECK = 1.0  # seconds between checks that the lock file is still the one held


class PublisherRole:
    """The role of publishing the node's ResourceSlices, held by one pod of the driver at a time."""

    def __init__(self, directory: Path, node: str) -> None:
        self.node = node
        self._lock = FileLock(directory / ROLE_FILE)

    @property
    def path(self) -> Path:
        """The lock file."""
        return self._lock.path

    @property
    def held(self) -> bool:
        """True while this pod publishes the slices."""
        return self._lock.held

    async def run(self, publish: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run publish() (which publishes until cancelled) whenever this pod holds the role: on standby until it
        does, stopped when the role is lost; the role is let go only once publish has stopped. Until cancelled."""
        errors = OncePerError(log, logging.ERROR)
        backoff = Backoff(initial=1.0, cap=30.0)
        try:
            while True:
                try:
                    await self.hold()
                except LockError as error:
                    errors.failed("cannot publish the ResourceSlices of node %s: %s (trying again)", self.node, error)
                    await backoff.sleep()
                    continue
                errors.succeeded()
                backoff.reset()
                await _first_of(publish(), self.until_lost())
                self.release()
        finally:
            self.release()

    async def hold(self) -> None:
        """Until this pod holds the role: at once when no other pod holds it, else when that one stops or dies.
        The wait is said in the log; cancelling it ends it."""
        if self._lock.try_take():
            log.info("publishing the ResourceSlices of node %s (holding %s)", self.node, self.path)
            return
        started = time.monotonic()
        log.info(
            "standby: another pod of this driver publishes the ResourceSlices of node %s (it holds %s); this pod "
            "serves the kubelet and takes over when that one stops",
            self.node,
            self.path,
        )
        try:
            while not self._lock.try_take():
                await asyncio.sleep(POLL)
        except BaseException:
            self._lock.release()
            raise
        waited = time.monotonic() - started
        log.info("took over publishing the ResourceSlices of node %s after %.1fs on standby", self.node, waited)

    async def until_lost(self) -> None:
        """Return when the lock file is no longer the one held (removed or replaced on the node): another pod may
        take the role on the new file, so this one must stop publishing."""
        while self._lock.still_ours():
            await asyncio.sleep(CHECK)
        log.warning("%s was removed or replaced: no longer publishing until the role is had again", self.path)

    def release(self) -> None:
        """Let the next pod take the role (call only once this pod's publisher has stopped)."""
        if self._lock.held:
            log.info("no longer publishing the ResourceSlices of node %s: %s released", self.node, self.path)
        self._lock.release()


async def _first_of(*works: Coroutine[Any, Any, None]) -> None:
    """Run works together until the first ends (its error raised), then cancel the others and wait for them."""
    tasks = [asyncio.ensure_future(work) for work in works]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()
