"""The node's one role and one reset turn, held by one pod of the agent at a time whatever its mode.

File locks on the node in `<plugins dir>/iluvatar.com/`, the directory both DaemonSets mount for the node-health
record.

The pod holding `node-role.lock` acts for the node: in device plugin mode it resets and heals, writes the CDI spec,
node labels, Events and GPU metrics; in DRA mode it also publishes the node's ResourceSlices. A pod of either mode
that starts while another acts, during a rolling update or a switch between the device plugin and DRA, waits on
standby: it serves the kubelet but does none of the role's work, so the two never take each other's writes for
foreign edits. The acting pod lets go as soon as its role's work has stopped (at SIGTERM), or the kernel lets go
when it dies (kill -9, OOM); the standby notices within POLL and does the work from then on. `reset.lock` is the
node's reset turn: every reset, by any pod of either mode, is made in it.

Pods of the release before this one held a role per front end, `iluvatar.com/device-plugin.lock` or
`gpu.iluvatar.com/publisher.lock`, and the DRA driver reset under `gpu.iluvatar.com/reset.lock`: a pod takes those of
them its DaemonSet mounts too (NodeLocks), after the node's, so that it does not act, or reset, while an older pod
still does under the old name. An old name that cannot serve as a lock (a directory) is one no older pod holds.
The old names are kept through 0.2.x and removed in 0.3.0 (EARLIER_NAMES_REMOVED_IN).

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
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.locks import FileLock, LockError, TurnLock
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

POLL = 0.1  # seconds between looks at a lock another pod holds: the longest a handover waits
CHECK = 1.0  # seconds between checks that the lock file is still the one held
RETRY_CAP = 5.0  # seconds at most between tries of a lock file that cannot serve (a symlink, a directory)
TURN_POLL = 0.05  # seconds between looks at the reset turn another pod holds (a reset takes seconds)

NODE_DIR = "iluvatar.com"  # under the kubelet's plugins directory, mounted by both DaemonSets
ROLE_FILE = "node-role.lock"
RESET_FILE = "reset.lock"  # the device plugin's reset turn had this name already
# The names the release before 0.1.0 used. They are kept through 0.2.x, so that an update that skips one release
# still waits for its old pods, and removed in EARLIER_NAMES_REMOVED_IN (tests/unit/runtime/test_noderole.py fails
# once the package's version reaches it).
EARLIER_NAMES_REMOVED_IN = "0.3.0"
EARLIER_PLUGIN_ROLE = f"{NODE_DIR}/device-plugin.lock"  # the release before: the device plugin's role
EARLIER_DRA_ROLE = "gpu.iluvatar.com/publisher.lock"  # the release before: the DRA driver's role
EARLIER_DRA_RESET = "gpu.iluvatar.com/reset.lock"  # the release before: the DRA driver's reset turn


@dataclass(frozen=True)
class NodeLocks:
    """The lock files a pod takes, in order, for the node's role and for its reset turn: the node's own first, then
    the names the release before used that this mode's DaemonSet mounts."""

    role: tuple[Path, ...]
    reset: tuple[Path, ...]

    def reset_turn(self, timeout: float) -> TurnLock:
        """The node's reset turn over these lock files, waited for at most timeout seconds."""
        return reset_turn(self.reset, timeout)

    @classmethod
    def device_plugin(cls, plugins_dir: Path) -> NodeLocks:
        """The device plugin's: it mounts `iluvatar.com` only (the earlier DRA driver's names are out of its reach;
        the earlier device plugin reset under the node's `reset.lock` already)."""
        node = plugins_dir / NODE_DIR
        return cls(role=(node / ROLE_FILE, plugins_dir / EARLIER_PLUGIN_ROLE), reset=(node / RESET_FILE,))

    @classmethod
    def dra(cls, plugins_dir: Path) -> NodeLocks:
        """The DRA driver's: it mounts `iluvatar.com` and `gpu.iluvatar.com`, so it waits for an earlier pod of
        either mode."""
        node = plugins_dir / NODE_DIR
        return cls(
            role=(node / ROLE_FILE, plugins_dir / EARLIER_PLUGIN_ROLE, plugins_dir / EARLIER_DRA_ROLE),
            reset=(node / RESET_FILE, plugins_dir / EARLIER_DRA_RESET),
        )


class NodeRole:
    """A node-wide role held by one pod at a time: every file lock of paths (the node's, then earlier names of it);
    duty says what the holder does, in the log ("publishing the ResourceSlices of node n")."""

    def __init__(self, paths: Sequence[Path], duty: str, *, held_through_stop: bool = False) -> None:
        self.duty = duty
        self._lock = FileLock(paths[0])
        self._earlier = [FileLock(path) for path in paths[1:]]  # an older pod may still hold one
        self._no_lock: set[Path] = set()  # earlier names that cannot serve as a lock: no older pod holds them
        self._held_through_stop = held_through_stop  # run's cancellation keeps the role: the owner releases it last
        self._errors = OncePerError(log, logging.ERROR)  # a lock file that cannot serve is said once, until fixed
        self.unusable = ""  # why the lock file cannot serve as one ("" when it can): no pod can hold the role

    @property
    def path(self) -> Path:
        """The node's lock file."""
        return self._lock.path

    @property
    def paths(self) -> tuple[Path, ...]:
        """Every lock file the role takes, the node's first."""
        return (self._lock.path, *(lock.path for lock in self._earlier))

    @property
    def held(self) -> bool:
        """True while this pod holds the role."""
        return self._lock.held and all(lock.held or lock.path in self._no_lock for lock in self._earlier)

    @property
    def waiting_for(self) -> Path:
        """The first lock file of the role this pod does not hold (the node's when it holds them all)."""
        if not self._lock.held:
            return self.path
        return next(
            (lock.path for lock in self._earlier if not lock.held and lock.path not in self._no_lock), self.path
        )

    def try_take(self) -> bool:
        """Take the role now if no other pod holds it; True when this pod holds it. Raises LockError for a lock
        file that cannot serve as one. Waiting for an earlier name, this pod keeps the node's: it is next."""
        if self.held:
            return True
        if not self._lock.try_take() or not all(self._take_earlier(lock) for lock in self._earlier):
            return False
        log.info("%s (holding %s)", self.duty, ", ".join(str(path) for path in self.paths))
        return True

    def _take_earlier(self, lock: FileLock) -> bool:
        if lock.held or lock.path in self._no_lock:
            return True
        try:
            return lock.try_take()
        except LockError as error:  # no older pod could lock it either
            self._no_lock.add(lock.path)
            log.warning("%s: no pod of an earlier release holds it; not waited for", error)
            return True

    def take_at_start(self) -> bool:
        """Take the role now if no other pod holds it (making the locks' directories); True when this pod holds it.

        A lock file that cannot serve (a symlink, a directory) is said once, naming it and the fix, and this pod
        stays on standby: run() tries again until the file is fixed. unusable says why meanwhile.
        """
        try:
            for path in self.paths:
                path.parent.mkdir(parents=True, exist_ok=True)
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
            self.waiting_for,
            self.duty,
        )
        try:
            while not self.try_take():
                await asyncio.sleep(POLL)
        except BaseException:
            self._release_all()
            raise
        waited = time.monotonic() - started
        log.info("took over after %.1fs on standby: %s", waited, self.duty)

    async def until_lost(self) -> None:
        """Return when a lock file is no longer the one held (removed or replaced on the node): another pod may
        take the role on the new file, so this one must stop its work."""
        while self._still_ours():
            await asyncio.sleep(CHECK)
        log.warning("%s was removed or replaced: no longer %s until the role is had again", self.path, self.duty)

    def _still_ours(self) -> bool:
        return self._lock.still_ours() and all(
            lock.path in self._no_lock or lock.still_ours() for lock in self._earlier
        )

    def release(self) -> None:
        """Let the next pod take the role (call only once this pod's work for it has stopped)."""
        if self.held:
            log.info("%s released: no longer %s", self.path, self.duty)
        self._release_all()

    def _release_all(self) -> None:
        for lock in (*reversed(self._earlier), self._lock):  # the node's last: the next pod takes the others first
            lock.release()


def reset_turn(paths: Sequence[Path], timeout: float, *, poll: float = TURN_POLL) -> TurnLock:
    """The node's turn to reset GPUs, shared by every pod of the agent whatever its mode: this process's turn, then
    each lock file of paths in order (see NodeLocks.reset), had within timeout seconds."""
    return TurnLock(
        paths,
        timeout,
        poll=poll,
        purpose="a GPU reset",
        busy="this process's other GPU resets kept the node's reset turn",
    )


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
