"""The tests' one way to wait: `until` returns as soon as the condition holds and names its last value when it never
does; `stays` holds for its whole period and fails at the first look the condition breaks."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from helpers.waits import WaitFailed, stays, stays_sync, until, until_sync


async def test_until_returns_the_value_as_soon_as_it_holds() -> None:
    looks = itertools.count()
    started = time.monotonic()
    assert await until(lambda: next(looks) >= 3 and "ready", timeout=5.0, interval=0.01) == "ready"
    assert time.monotonic() - started < 1.0


async def test_until_names_what_it_waited_for_and_the_last_value_seen() -> None:
    with pytest.raises(WaitFailed) as raised:
        await until(lambda: None, timeout=0.1, message="the answer")
    assert "the answer" in str(raised.value) and "last value seen: None" in str(raised.value)
    with pytest.raises(AssertionError, match=r"last value seen: \[\]"):
        await until(lambda: [], timeout=0.05, message="a non-empty list")


async def test_until_lets_the_event_loop_run_while_it_waits() -> None:
    done = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, done.set)
    await until(done.is_set, timeout=2.0, message="the event")


async def test_stays_passes_when_the_condition_holds_for_the_whole_period() -> None:
    started = time.monotonic()
    await stays(lambda: True, for_=0.1, message="always")
    assert time.monotonic() - started >= 0.1


async def test_stays_fails_at_the_first_look_the_condition_breaks_midway() -> None:
    broken = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, broken.set)
    started = time.monotonic()
    with pytest.raises(WaitFailed, match=r"no write was to hold for 5 s but broke after 0\.\d+ s; value then: False"):
        await stays(lambda: not broken.is_set(), for_=5.0, message="no write")
    assert time.monotonic() - started < 1.0, "it failed at the break, not at the end of the period"


async def test_stays_fails_when_the_condition_does_not_hold_at_the_start() -> None:
    with pytest.raises(WaitFailed, match=r"broke after 0\.00 s"):
        await stays(lambda: 0, for_=1.0, message="zero is falsy")


def test_the_sync_forms_wait_and_fail_the_same_way() -> None:
    looks = itertools.count()
    assert until_sync(lambda: next(looks) >= 2, timeout=2.0, interval=0.01) is True
    with pytest.raises(WaitFailed, match="last value seen: 0"):
        until_sync(lambda: 0, timeout=0.05, message="a count")
    stays_sync(lambda: True, for_=0.05)
    flips = iter([True, True, False])
    with pytest.raises(WaitFailed, match="value then: False"):
        stays_sync(lambda: next(flips), for_=5.0, interval=0.01, message="flips")


def test_a_failure_without_a_message_names_the_condition_by_its_code() -> None:
    def chip_is_healthy() -> bool:
        return False

    with pytest.raises(WaitFailed, match="chip_is_healthy"):
        until_sync(chip_is_healthy, timeout=0.02)


async def test_the_async_forms_await_what_the_condition_returns() -> None:
    answers = iter([[], [], ["GPU-0"]])

    async def ask() -> list[str]:
        return next(answers)

    assert await until(ask, timeout=2.0, interval=0.01) == ["GPU-0"]
    with pytest.raises(WaitFailed, match="value then: 0"):
        await stays(lambda: asyncio.sleep(0, result=0), for_=1.0, message="an awaited zero")
