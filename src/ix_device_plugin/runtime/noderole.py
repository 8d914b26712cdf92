"""A node-wide role held by one pod of the agent at a time: the holder of a file lock on the node, which every pod
of that front end mounts. The DRA driver's pod holding `<plugins dir>/gpu.iluvatar.com/publisher.lock` publishes the
node's ResourceSlices; the device plugin's pod holding `<plugins dir>/iluvatar.com/device-plugin.lock` acts for the
node (resets, the CDI spec, node labels, Events, GPU metrics).

During a rolling update the new pod finds the lock held and waits on standby: it serves the kubelet but does none of
the role's work, so the two never take each other's writes for foreign edits. The old pod lets go as soon as its
role's work has stopped (at SIGTERM), or the kernel lets go when it dies (kill -9, OOM); the standby notices within
POLL and does the work from then on.

A node-local lock rather than a coordination.k8s.io Lease: it costs the API server nothing (a Lease renewed by
every node is a write per node every few seconds at fleet scale), it is handed over within POLL instead of a
lease duration, and it does not depend on the API server (a node that lost it keeps its one holder). A pod
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

POLL = 0.1  # seconds between looks at a lock another pod holds: the longest a handover waits
CHECK = 1.0  # seconds between checks that the lock file is still the one held
RETRY_CAP = 5.0  # seconds at most between tries of a lock file that cannot serve (a symlink, a directory)


class NodeRole:
    """A node-wide role held by one pod at a time: the file lock at path; duty says what the holder does, in the
    log ("publishing the ResourceSlices of node n")."""

    def __init__(self, path: Path, duty: str, *, held_through_stop: bool = False) -> None:
        self.duty = duty
        self._lock = FileLock(path)
        self._held_through_stop = held_through_stop  # run's cancellation keeps the role: the owner releases it last
        self._errors = OncePerError(log, logging.ERROR)  # a lock file that cannot serve is said once, until fixed
        self.unusable = ""  # why the lock file cannot serve as one ("" when it can): no pod can hold the role

    @property
    def path(self) -> Path:
        """The lock file."""
        return self._lock.path

    @property
    def held(self) -> bool:
        """True while this pod holds the role."""
        return self._lock.held

    def try_take(self) -> bool:
        """Take the role now if no other pod holds it; True when this pod holds it. Raises LockError for a lock
        file that cannot serve as one."""
        if self._lock.held:
            return True
        if self._lock.try_take():
            log.info("%s (holding %s)", self.duty, self.path)
            return True
        return False

    def take_at_start(self) -> bool:
        """Take the role now if no other pod holds it (making the lock's directory); True when this pod holds it.

        A lock file that cannot serve (a symlink, a directory) is said once, naming it and the fix, and this pod
        stays on standby: run() tries again until the file is fixed. unusable says why meanwhile.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return self.try_take()
        except (LockError, OSError) as error:
            self._unusable(error)
            return False

    def _unusable(self, error: Exception) -> None:
        self.unusable = str(error)
        self._errors.failed(
            "cannot take the role of %s: %s; this pod serves on standby, acting for nothing, and takes the role once "
            "the file is fixed",
            self.duty, error,
        )  # fmt: skip

    async def run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run work() (which runs until cancelled) whenever this pod holds the role: on standby until it does,
        stopped when the role is lost; the role is let go only once work has stopped (held_through_stop: a cancel
        keeps it, for the owner to release once its stop is over). Until cancelled."""
        backoff = Backoff(initial=1.0, cap=RETRY_CAP)
        try:
            while True:
                try:
                    await self.hold()
                except (LockError, OSError) as error:
                    self._unusable(error)
                    await backoff.sleep()
                    continue
                self._errors.succeeded("%s can serve as a lock again: %s", self.path, self.duty)
                self.unusable = ""
                backoff.reset()
                await _first_of(work(), self.until_lost())
                self.release()
        finally:
            if not self._held_through_stop:
                self.release()

    async def hold(self) -> None:
        """Until this pod holds the role: at once when no other pod holds it, else when that one stops or dies.
        The wait is said in the log; cancelling it ends it."""
        if self.try_take():
            return
        started = time.monotonic()
        log.info(
            "standby: another pod holds %s (%s); this pod serves the kubelet and takes over when that one stops",
            self.path,
            self.duty,
        )
        try:
            while not self._lock.try_take():
                await asyncio.sleep(POLL)
        except BaseException:
            self._lock.release()
            raise
        waited = time.monotonic() - started
        log.info("took over after %.1fs on standby: %s", waited, self.duty)

    async def until_lost(self) -> None:
        """Return when the lock file is no longer the one held (removed or replaced on the node): another pod may
        take the role on the new file, so this one must stop its work."""
        while self._lock.still_ours():
            await asyncio.sleep(CHECK)
        log.warning("%s was removed or replaced: no longer %s until the role is had again", self.path, self.duty)

    def release(self) -> None:
        """Let the next pod take the role (call only once this pod's work for it has stopped)."""
        if self._lock.held:
            log.info("%s released: no longer %s", self.path, self.duty)
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
