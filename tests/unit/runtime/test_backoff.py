"""The one retry policy: capped, jittered exponential delays, and retrying only what says it is transient."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.runtime.backoff import Backoff, is_transient


class Flaky(Exception):
    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def test_backoff_grows_to_the_cap_and_resets():
    backoff = Backoff(initial=0.5, cap=4.0, factor=2.0, jitter=0.0)
    assert [backoff.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    backoff.reset()
    assert backoff.next_delay() == 0.5


@given(
    initial=st.floats(0.01, 5.0),
    cap=st.floats(0.01, 60.0),
    jitter=st.floats(0.0, 0.9),
    tries=st.integers(1, 80),
    seed=st.integers(0, 2**32),
)
def test_backoff_delays_stay_within_jitter_of_the_capped_exponential(initial, cap, jitter, tries, seed):
    backoff = Backoff(initial=initial, cap=cap, factor=2.0, jitter=jitter, rng=random.Random(seed))
    for attempt in range(tries):
        base = min(cap, initial * 2.0**attempt)
        delay = backoff.next_delay()
        assert base * (1 - jitter) - 1e-9 <= delay <= min(cap, base * (1 + jitter)) + 1e-9


def test_only_errors_that_say_so_are_transient():
    assert is_transient(Flaky("busy", transient=True))
    assert not is_transient(Flaky("refused", transient=False))
    assert not is_transient(ValueError("a bug"))


async def test_retry_tries_transient_failures_again_logs_each_once_and_resets(caplog):
    outcomes: list[Exception | str] = [Flaky("busy", True), Flaky("busy", True), Flaky("down", True), "done"]
    backoff = Backoff(initial=0.001, cap=0.002)

    async def call() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    with caplog.at_level(logging.INFO, logger="ix_device_plugin.runtime.backoff"):
        assert await backoff.retry(call, recovered="the call works again") == "done"
    assert [r.getMessage() for r in caplog.records] == ["busy (retrying)", "down (retrying)", "the call works again"]
    assert backoff.attempt == 0


async def test_retry_raises_at_once_what_trying_again_cannot_fix_and_stops_after_the_attempts():
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise Flaky("refused", transient=False)

    with pytest.raises(Flaky, match="refused"):
        await Backoff(initial=0.001).retry(refused)
    assert calls == 1

    async def busy() -> None:
        nonlocal calls
        calls += 1
        raise Flaky("busy", transient=True)

    calls = 0
    with pytest.raises(Flaky, match="busy"):
        await Backoff(initial=0.001, cap=0.001).retry(busy, attempts=3)
    assert calls == 3
