"""The one way the tests and the bench wait on an event: `until` it holds, or that it `stays` holding for a period.

Each comes in an async form (for code on the event loop, which must keep running while it waits) and a sync form
(`until_sync`, `stays_sync`, for code that watches another process). A failure names what was waited for and the
last value seen, so a flake says what it saw instead of only that time ran out. The tests import it as helpers.waits;
the end-to-end suite has its own (e2e/harness/waits.py: its looks ask a real API server and fail with the logs).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

DEFAULT_TIMEOUT = 5.0
DEFAULT_INTERVAL = 0.02


class WaitFailed(AssertionError):
    """A wait ended without what it waited for: `until` timed out, or `stays` saw the condition break."""


def _describe(predicate: Callable[[], Any], message: str | None) -> str:
    return message or getattr(predicate, "__qualname__", repr(predicate))


def _timed_out(predicate: Callable[[], Any], message: str | None, timeout: float, last: Any) -> WaitFailed:
    return WaitFailed(f"waited {timeout:g} s for {_describe(predicate, message)}; last value seen: {last!r}")


def _broke(predicate: Callable[[], Any], message: str | None, for_: float, after: float, last: Any) -> WaitFailed:
    what = _describe(predicate, message)
    return WaitFailed(f"{what} was to hold for {for_:g} s but broke after {after:.2f} s; value then: {last!r}")


async def until(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    message: str | None = None,
) -> Any:
    """Wait until predicate() is truthy, looking every interval seconds; return that value. predicate may return an
    awaitable (a coroutine asking a stand-in, a to_thread call): its result is what is looked at.

    Raises WaitFailed (an AssertionError) after timeout seconds, naming message and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while not (last := await _value(predicate)):
        if time.monotonic() >= deadline:
            raise _timed_out(predicate, message, timeout, last)
        await asyncio.sleep(interval)
    return last


async def _value(predicate: Callable[[], Any]) -> Any:
    value = predicate()
    return await value if inspect.isawaitable(value) else value


async def stays(
    predicate: Callable[[], Any],
    for_: float,
    interval: float = DEFAULT_INTERVAL,
    message: str | None = None,
) -> None:
    """Check that predicate() (or the awaitable it returns) is truthy now and at every look for for_ seconds; fail at
    the first look it is not."""
    start = time.monotonic()
    while True:
        if not (last := await _value(predicate)):
            raise _broke(predicate, message, for_, time.monotonic() - start, last)
        if time.monotonic() - start >= for_:
            return
        await asyncio.sleep(interval)


def until_sync(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    message: str | None = None,
) -> Any:
    """`until` for code off the event loop: blocks the thread between looks."""
    deadline = time.monotonic() + timeout
    while not (last := predicate()):
        if time.monotonic() >= deadline:
            raise _timed_out(predicate, message, timeout, last)
        time.sleep(interval)
    return last


def stays_sync(
    predicate: Callable[[], Any],
    for_: float,
    interval: float = DEFAULT_INTERVAL,
    message: str | None = None,
) -> None:
    """`stays` for code off the event loop: blocks the thread between looks."""
    start = time.monotonic()
    while True:
        if not (last := predicate()):
            raise _broke(predicate, message, for_, time.monotonic() - start, last)
        if time.monotonic() - start >= for_:
            return
        time.sleep(interval)
