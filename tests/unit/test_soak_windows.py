"""The soak's model of broken chips (e2e/soak/windows.py): an XID the agent may rightly have forgotten when its record
was made unreadable is neither held against it ("broken not given") nor expected back in service before a reset, a
return or the chip seen in service again; the hardware is not made to report it again."""

from __future__ import annotations

from tests.helpers.soak_modules import load

checker = load("checker")
windows = load("windows")

FORGOTTEN_AT = 20.0


def forgotten_xid(heals_by: str = "return") -> tuple[list, object]:
    """Chip 1 with XID 64 since 5 s (waiting for an operator), chip 2 with a health bit since 6 s, the record made
    unreadable at FORGOTTEN_AT."""
    broken: list = []
    model = windows.Windows(broken)
    model.add(1, 5.0, heals_by, "XID 64")
    model.add(2, 6.0, "reset", "health Memory")
    model.forget_xids(FORGOTTEN_AT, "the node-health record made unreadable")
    return broken, model


def test_a_chip_the_agent_may_have_remembered_is_not_expected_back_before_it_is_healed() -> None:
    """The acting pod writes the record again at once, so the restarted agent may well keep the chip out until an
    operator returns it: expecting it back BOUND_S after the forgetting was a false violation."""
    broken, model = forgotten_xid()
    later = FORGOTTEN_AT + checker.BOUND_S + 30
    assert not checker.healthy_since(1, later, broken, [])
    model.awaits_reset(1, later)  # the operator's return
    model.close(lambda chip, since, by, why: chip == 1 and by == "reset", later + 1, "healed by the reset")
    assert checker.healthy_since(1, later + 1 + checker.BOUND_S, broken, [])
    assert model.open == [(2, 6.0, "reset", "health Memory")]  # a health bit: the hardware still says it


def test_a_chip_the_agent_forgot_counts_as_healed_once_seen_in_service_a_while_after() -> None:
    broken, model = forgotten_xid()
    model.seen_back(FORGOTTEN_AT + windows.SEEN_AFTER_S - 1, lambda chip: True)  # what was served before the kill
    assert any(window[0] == 1 for window in model.open)
    model.seen_back(FORGOTTEN_AT + windows.SEEN_AFTER_S + 1, lambda chip: chip != 1)
    assert any(window[0] == 1 for window in model.open)
    seen = FORGOTTEN_AT + windows.SEEN_AFTER_S + 2
    model.seen_back(seen, lambda chip: True)
    assert [window[0] for window in model.open] == [2]  # the certain window stays: only a reset heals it
    assert checker.healthy_since(1, seen + checker.BOUND_S, broken, [])
    assert "in service again" in [b for b in broken if b.chip == 1][-1].why


def test_a_forgotten_chip_given_out_is_no_violation_but_one_broken_before_the_forgetting_is() -> None:
    broken, _ = forgotten_xid()
    invariant = checker.Invariant("broken not given")
    allocations = [
        checker.NewAllocation("before", frozenset({1}), 10.0, 11.0),
        checker.NewAllocation("after", frozenset({1}), FORGOTTEN_AT + 5, FORGOTTEN_AT + 6),
    ]
    checker.broken_not_given(invariant, allocations, broken)
    assert invariant.checks == 2 and [v[1].split()[0] for v in invariant.violations] == ["before"]


def test_each_chip_gets_one_window_it_may_have_forgotten_healed_as_its_xids_need() -> None:
    broken: list = []
    model = windows.Windows(broken)
    model.add(0, 1.0, "reset", "XID 74")
    model.add(0, 2.0, "return", "XID 64")
    model.add(3, 3.0, "reset", "XID 48")
    model.add(3, 4.0, "return", "fell off the bus")
    model.forget_xids(FORGOTTEN_AT, "unreadable")
    assert sorted(model.open) == [
        (0, FORGOTTEN_AT, "return", "XID 74; XID 64; maybe forgotten"),
        (3, 4.0, "return", "fell off the bus"),
        (3, FORGOTTEN_AT, "reset", "XID 48; maybe forgotten"),
    ]
    assert [b.until for b in broken[:3]] == [FORGOTTEN_AT] * 3 and broken[3].until is None
    assert not model.certainly_broken(0) and model.certainly_broken(3)


def test_a_new_agent_process_is_sent_again_only_the_xids_it_cannot_have_forgotten() -> None:
    _, model = forgotten_xid()
    model.add(3, 30.0, "reset", "XID 48")
    assert model.still_broken_xids() == {3: [48]}


def test_a_reset_seen_late_heals_only_what_broke_before_it_ended() -> None:
    broken: list = []
    model = windows.Windows(broken)
    model.add(3, 30.8, "reset", "XID 46")
    model.add(3, 31.8, "reset", "health Memory")  # set after the reset that ended at 31.2, seen at 31.9
    assert model.opened_since(3, 31.2) == {"health Memory"}
    model.close(lambda chip, since, by, why: chip == 3 and since < 31.2 and by == "reset", 31.2, "healed")
    assert model.open == [(3, 31.8, "reset", "health Memory")]
