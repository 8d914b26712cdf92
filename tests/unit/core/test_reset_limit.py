"""The reset limit: a chip reset N times (one per fault) within a window is not reset again automatically at its
next fault; the history is one time per episode, given back by a reset that reset nothing, and cleared by an
operator's return."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core import healing
from ix_device_plugin.core.healing import (
    HEALTHY,
    NEEDS_OPERATOR,
    NO_LIMIT,
    RESETTING,
    WAITING,
    Care,
    Diagnosis,
    ResetLimit,
    Rules,
)

pytestmark = pytest.mark.unit
RULES = Rules(attempts=3, backoff=10.0, backoff_cap=25.0, refused_wait=60.0, settle=0.0)
LIMIT = ResetLimit(count=2, window=86400.0)
XID48 = Diagnosis(resettable=("XID 48",))
HOUR = 3600.0
DAY = 86400.0
T0 = 1_700_000_000.0  # a Unix time


def see(care: Care, diagnosis: Diagnosis, wall: float, limit: ResetLimit = LIMIT) -> Care:
    """The chip seen with diagnosis at wall (the monotonic clock reads the same here)."""
    return healing.observe(care, diagnosis, wall, RULES, True, limit=limit, wall_now=wall)


def fault(care: Care, wall: float, limit: ResetLimit = LIMIT) -> Care:
    """An XID 48 on the chip at wall, and its reset if it is due: where it stands after it."""
    care = see(care, XID48, wall, limit)
    if not healing.due(care, wall):
        return care
    care = healing.reset_done(healing.started(care, wall), Diagnosis(), wall, RULES)
    return see(care, Diagnosis(), wall, limit)


def test_the_first_n_faults_are_healed_and_the_next_within_the_window_is_left_to_an_operator() -> None:
    care = fault(Care("GPU-a", 3), T0)
    care = fault(care, T0 + HOUR)
    assert care.phase == HEALTHY and care.resets == (T0, T0 + HOUR)  # healed twice, both remembered
    third = fault(care, T0 + 2 * HOUR)
    assert third.phase == NEEDS_OPERATOR and third.limited and third.attempts == 0
    assert third.note == "reset 2 times within 24h: not reset again automatically"
    assert third.resets == care.resets  # not reset: nothing added
    assert see(third, XID48, T0 + 3 * DAY) == third  # it stays out, however long it waits (an operator's now)


def test_a_fault_once_the_old_resets_are_outside_the_window_is_healed() -> None:
    care = fault(fault(Care("GPU-a", 3), T0), T0 + HOUR)
    later = fault(care, T0 + DAY + 1.0)  # the first reset is more than a day old: one reset within the window
    assert later.phase == HEALTHY and later.resets == (T0, T0 + HOUR, T0 + DAY + 1.0)
    assert fault(later, T0 + DAY + 2.0).phase == NEEDS_OPERATOR  # now two within the day again


def test_a_limit_of_0_is_no_limit() -> None:
    care = Care("GPU-a", 0)
    for n in range(10):
        care = fault(care, T0 + n, ResetLimit(count=0, window=DAY))
        assert care.phase == HEALTHY
    assert len(care.resets) == 10
    assert not NO_LIMIT.reached(care.resets, T0 + 10)


def test_retries_within_one_fault_count_once_and_a_reset_that_reset_nothing_gives_its_time_back() -> None:
    care = see(Care("GPU-a", 0), XID48, T0)
    first = healing.started(care, T0)
    assert first.resets == (T0,)
    failed = healing.failed(first, "ixsmi exited with code 3", T0, RULES)
    second = healing.started(failed, T0 + 10.0)
    assert (second.attempts, second.resets) == (2, (T0,))  # a retry of the same fault
    assert see(healing.failed(second, "no", T0 + 10, RULES), XID48, T0 + 20).phase == WAITING  # retries go on
    refused = healing.refused(first, "ix-exporter did not let go", T0 + 1.0, RULES)
    assert (refused.phase, refused.attempts, refused.resets) == (WAITING, 0, ())
    held = healing.taken_back(first)
    assert (held.phase, held.attempts, held.resets) == (WAITING, 0, ())
    assert healing.taken_back(second).resets == (T0,)  # the retry took no place: the first reset's stays


def test_an_operators_return_clears_the_history_and_its_reset_is_not_counted() -> None:
    limited = fault(fault(fault(Care("GPU-a", 3), T0), T0 + 1), T0 + 2)
    assert limited.phase == NEEDS_OPERATOR and limited.limited
    asked = healing.operator_asked(limited)
    assert asked.phase == WAITING and asked.resets == () and not asked.limited
    returned = healing.reset_done(healing.started(asked, T0 + 3), Diagnosis(), T0 + 3, RULES)
    assert returned.phase == HEALTHY and returned.resets == ()
    again = fault(fault(returned, T0 + 4), T0 + 5)
    assert again.phase == HEALTHY and again.resets == (T0 + 4, T0 + 5)  # N more, as a new chip
    assert fault(again, T0 + 6).phase == NEEDS_OPERATOR


def test_a_limited_chip_that_comes_back_by_itself_keeps_its_history() -> None:
    limited = fault(fault(fault(Care("GPU-a", 3), T0), T0 + 1), T0 + 2)
    back = see(limited, Diagnosis(), T0 + 3)
    assert back.phase == HEALTHY and not back.limited and back.resets == (T0, T0 + 1)
    assert fault(back, T0 + 4).phase == NEEDS_OPERATOR  # still two within the day
    assert fault(back, T0 + DAY + 0.5).phase == HEALTHY  # one within the day


def test_the_limit_is_read_when_the_chip_goes_out_not_during_its_episode() -> None:
    care = fault(Care("GPU-a", 0), T0)
    waiting = see(care, XID48, T0 + 1)
    assert waiting.phase == WAITING
    resetting = healing.started(waiting, T0 + 1)
    failed = healing.failed(resetting, "no", T0 + 1, RULES)  # two resets in the history now, a retry to come
    assert see(failed, XID48, T0 + 2).phase == WAITING
    assert see(resetting, XID48, T0 + 2).phase == RESETTING


def test_the_window_is_said_as_people_say_it() -> None:
    assert [healing.span(s) for s in (86400.0, 5400.0, 90.0, 45.0, 0.5)] == ["24h", "90m", "90s", "45s", "0.5s"]


@given(st.lists(st.floats(min_value=1.0, max_value=3 * HOUR), min_size=1, max_size=30), st.integers(1, 4))
def test_no_window_holds_more_automatic_resets_than_the_limit(gaps: list[float], count: int) -> None:
    limit = ResetLimit(count=count, window=4 * HOUR)
    care, wall, started = Care("GPU-a", 0), T0, []
    for gap in gaps:
        wall += gap
        before = care
        care = fault(care, wall, limit)
        if care.resets != before.resets:
            started.append(wall)
        if care.phase == NEEDS_OPERATOR:
            care = see(care, Diagnosis(), wall + 0.5, limit)  # it clears by itself (a reboot): back, history kept
    for at in started:
        assert len([t for t in started if at <= t < at + limit.window]) <= count
