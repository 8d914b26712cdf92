"""The turns the prepared claims are changed in.

The claims' lock and the node's reset turn, each this process's asyncio lock and a file lock shared with the other
pods of the driver; and the kubelet's calls on one claim, one at a time in the order they came. `DraState` holds
them; nothing here knows what a claim is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.locks import FileLock

LOCK_FILE = "serialize.lock"  # the name the upstream kubelet-plugin helper uses for the same purpose
RESET_LOCK_FILE = "reset.lock"  # a driver's reset turn alone (tests); the node's is runtime/noderole.py NodeLocks.dra
LOCK_POLL = 0.005  # another driver holds the lock for milliseconds (one prepare's writes)


@contextlib.asynccontextmanager
async def both_locks(turn: asyncio.Lock, path: Path, timeout: float, purpose: str) -> AsyncIterator[None]:
    """This process's turn, then the file lock at path shared with the other pods, both within timeout seconds
    (the wait for the file is said in the log; cancelling ends it); OutputError past it."""
    deadline = time.monotonic() + timeout
    try:
        async with asyncio.timeout(timeout):
            await turn.acquire()
    except TimeoutError:
        raise OutputError(f"{path}: this driver's other calls kept it for more than {timeout:g}s ({purpose})") from None
    try:
        lock = FileLock(path)
        await lock.take(max(0.0, deadline - time.monotonic()), poll=LOCK_POLL, purpose=purpose)
        try:
            yield
        finally:
            lock.release()
    finally:
        turn.release()


class ClaimTurns:
    """The calls on each claim, one at a time in the order they came (asyncio.Lock wakes its waiters in order)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def of(self, uid: str) -> AsyncIterator[None]:
        """This call's turn on the claim uid."""
        lock, users = self._locks.get(uid, (asyncio.Lock(), 0))
        self._locks[uid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[uid]
            if users == 1:
                del self._locks[uid]
            else:
                self._locks[uid] = (lock, users - 1)


def forget_when_done(work: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    """A done callback that takes the task out of work, its outcome retrieved (the caller, if still there, got it)."""

    def ended(task: asyncio.Task[Any]) -> None:
        work.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the caller, if still there, got it

    return ended
