"""Exclusive locks on files that two pods of one node share (flock), and the turns made of them.

A `TurnLock` is an asyncio lock, then each file lock. Taken with a deadline, the wait said in the log, and given up at
once when the waiting task is cancelled (a SIGTERM while waiting stops the wait).

The kernel lets go of a lock when its holder dies, so a pod that was killed holds nothing. A lock file is never
removed: a lock taken on a file that was removed or replaced meanwhile guards nothing, so a lock counts only while
the file at its path is still the one locked.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from ix_device_plugin.runtime.files import OutputError, reason

log = logging.getLogger(__name__)

ANNOUNCE_AFTER = 1.0  # seconds of waiting before the log says who is waited for


class LockError(OutputError):
    """A lock file that cannot be opened, or that another process held past the deadline; the message names it."""


class FileLock:
    """An exclusive flock on the file at path (created when missing; a symbolic link or a directory is refused)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._descriptor: int | None = None
        self._locked = False

    @property
    def held(self) -> bool:
        """True while this holds the lock (see still_ours for whether it still guards the path)."""
        return self._locked

    def try_take(self) -> bool:
        """Take the lock if nobody holds it; False when another does. Raises LockError for a file that cannot
        serve as a lock."""
        if self._locked:
            return True
        if self._descriptor is None:
            self._descriptor = _open(self.path)
        try:
            fcntl.flock(self._descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as error:
            self.release()
            raise LockError(f"cannot lock {self.path}: {reason(error)}") from None
        self._locked = True
        if not self.still_ours():  # removed or replaced between the open and the lock: take the new file next time
            self.release()
            return False
        return True

    def still_ours(self) -> bool:
        """True while the lock is held and the path still names the file locked."""
        if self._descriptor is None or not self._locked:
            return False
        try:
            held, named = os.fstat(self._descriptor), self.path.lstat()
        except OSError:
            return False
        return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)

    def release(self) -> None:
        """Let go of the lock (and close the file); nothing when not held."""
        descriptor, self._descriptor, self._locked = self._descriptor, None, False
        if descriptor is not None:
            os.close(descriptor)

    async def take(self, timeout: float, *, poll: float, purpose: str) -> float:
        """Take the lock, waiting at most timeout seconds; the seconds waited.

        A wait longer than ANNOUNCE_AFTER is said in the log, naming purpose; LockError past the deadline. Cancelling
        the caller ends the wait at once.
        """
        started = time.monotonic()
        announced = False
        try:
            while not self.try_take():
                waited = time.monotonic() - started
                if not announced and waited >= min(ANNOUNCE_AFTER, timeout):
                    announced = True
                    log.warning(
                        "waiting for %s, which another process holds (%s); giving up after %gs",
                        self.path, purpose, round(timeout, 1),
                    )  # fmt: skip
                if waited >= timeout:
                    raise LockError(
                        f"{self.path} is held by another process for more than {round(timeout, 1):g}s ({purpose}): "
                        "another pod of the driver on this node wedged?"
                    )
                await asyncio.sleep(poll)
        except BaseException:
            self.release()
            raise
        waited = time.monotonic() - started
        if announced:
            log.info("took %s after waiting %.1fs", self.path, waited)
        return waited


class TurnLock:
    """A turn that this process's tasks and the other pods of the node take one at a time: this process's asyncio
    lock, then the file lock of each path in order, all had within one deadline; let go in reverse order.

    purpose names the turn in the wait's log and errors ("prepared claims", "a GPU reset"); busy: the error when this
    process's own tasks kept the turn past the deadline ("... kept it", completed by "for more than 10s"); timeout:
    the default deadline, in seconds.
    """

    def __init__(self, paths: Sequence[Path], timeout: float, *, poll: float, purpose: str, busy: str = "") -> None:
        self.paths = tuple(paths)
        self.timeout = timeout
        self.purpose = purpose
        self._poll = poll
        self._busy = busy or f"this process's other tasks kept the turn ({purpose})"
        self._in_process = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def held(self, timeout: float | None = None) -> AsyncIterator[None]:
        """Inside the turn: every lock had within timeout seconds (self.timeout by default; a wait for another
        pod's is said in the log; cancelling ends it); OutputError past it."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        try:
            async with asyncio.timeout(limit):
                await self._in_process.acquire()
        except TimeoutError:
            raise OutputError(f"{self._busy} for more than {limit:g}s") from None
        taken: list[FileLock] = []
        try:
            for path in self.paths:
                lock = FileLock(path)
                _make_parent(path)
                await lock.take(max(0.0, deadline - time.monotonic()), poll=self._poll, purpose=self.purpose)
                taken.append(lock)
            yield
        finally:
            for lock in reversed(taken):
                lock.release()
            self._in_process.release()


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise LockError(f"cannot make the directory of the lock file {path}: {error}") from None


def _open(path: Path) -> int:
    """The lock file's descriptor, made when missing and never through a symlink; LockError saying what is wrong
    with it."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except IsADirectoryError:
        raise LockError(f"the lock file {path} is a directory; remove it (a lock file is made there)") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise LockError(f"the lock file {path} is a symbolic link; not followed: remove it") from None
        raise LockError(f"cannot open the lock file {path}: {reason(error)}") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise LockError(f"the lock file {path} is not a regular file; remove it (a lock file is made there)")
    return descriptor
