"""The turns the prepared claims are changed in.

The claims' turn (a `runtime/locks.py` TurnLock over a file shared with the other pods of the driver, as the node's
reset turn is one), and the kubelet's calls on one claim, one at a time in the order they came. `DraState` holds
them; nothing here knows what a claim is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ix_device_plugin.runtime.locks import TurnLock

LOCK_FILE = "serialize.lock"  # the name the upstream kubelet-plugin helper uses for the same purpose
RESET_LOCK_FILE = "reset.lock"  # a driver's reset turn alone (tests); the node's is runtime/noderole.py NodeLocks.dra
LOCK_POLL = 0.005  # another driver holds the lock for milliseconds (one prepare's writes)


def claims_turn(directory: Path, timeout: float) -> TurnLock:
    """The claims' turn: this driver's, then the file lock in directory shared with the other pods of the driver,
    waited for timeout seconds by default; OutputError past it."""
    lock = directory / LOCK_FILE
    busy = f"{lock}: this driver's other calls kept it"
    return TurnLock((lock,), timeout, poll=LOCK_POLL, purpose="prepared claims", busy=busy)


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
