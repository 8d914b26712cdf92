"""The one way the end-to-end suite waits: `until` something holds, or that it `stays` holding for a stated period.

A fixed sleep and then an assert is either too short on a busy machine (a flake) or longer than needed everywhere
else, so neither the harness nor a scenario does it. Every wait is bounded and a failure says what was awaited,
the last value (or error) seen and the tail of the logs passed in, so a stuck component fails the scenario that
needed it, with the lines that explain why, instead of holding up CI.

These are the end-to-end suite's own (the unit suite has tests/helpers/waits.py): here a look asks a real API
server or reads a real log, so an error from a look counts as "not yet", and a failure carries the components' logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from .procs import describe_logs

T = TypeVar("T")
DEFAULT_INTERVAL = 0.5
SHOWN_VALUE_CHARS = 500


class WaitFailed(AssertionError):
    """A wait ended without what it waited for; the message has what, the last value seen and the log tails."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else f"{text[:SHOWN_VALUE_CHARS]}..."


def _seen(last: object, error: BaseException | None) -> str:
    return f"last error: {error!r}" if error is not None else f"last value seen: {_shown(last)}"


def until(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    logs: Iterable[Path] = (),
    interval: float = DEFAULT_INTERVAL,
) -> T:
    """Look at predicate() every interval seconds until it is truthy and return that value.

    An exception from a look counts as "not yet" (an API server busy for a moment). After timeout seconds,
    WaitFailed naming what, the last value or error seen and the tails of logs.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            last, error = predicate(), None
            if last:
                return last  # type: ignore[return-value]
        except Exception as raised:
            error = raised
        if time.monotonic() >= deadline:
            raise WaitFailed(f"{what}: not within {timeout:g} s ({_seen(last, error)}){describe_logs(logs)}")
        time.sleep(interval)


def stays(
    predicate: Callable[[], object],
    for_: float,
    what: str,
    logs: Iterable[Path] = (),
    interval: float = DEFAULT_INTERVAL,
) -> None:
    """Check that predicate() is truthy now and at every look for for_ seconds: nothing happens that should not.

    The first falsy look (or an exception from one: that it still holds is then unknown) fails at once with
    WaitFailed naming what, when it broke, the value or error then and the tails of logs.
    """
    start = time.monotonic()
    while True:
        last: object = None
        error: BaseException | None = None
        try:
            last = predicate()
        except Exception as raised:
            error = raised
        if error is not None or not last:
            after = time.monotonic() - start
            raise WaitFailed(
                f"{what}: was to hold for {for_:g} s but broke after {after:.1f} s ({_seen(last, error)})"
                f"{describe_logs(logs)}"
            )
        if time.monotonic() - start >= for_:
            return
        time.sleep(interval)
