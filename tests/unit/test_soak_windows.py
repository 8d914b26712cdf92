"""The soak's model of broken chips (e2e/soak/windows.py): an XID the agent may rightly have forgotten when its record
was made unreadable is neither held against it ("broken not given") nor expected back in service before a reset, a
return or the chip seen in service again; the hardware is not made to report it again."""

from __future__ import annotations

from tests.helpers.soak_modules import load

checker = load("checker")
limits = load("limits")
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


def split_replicas_2(healthy) -> int:  # type: ignore[no-untyped-def]
    """The device plugin's allocatable with splitboard and 2 replicas: 2 a chip."""
    return 2 * sum(1 for chip in range(4) if healthy(chip))


def test_a_chip_broken_moments_ago_may_still_count_in_allocatable_so_another_is_not_taken_as_forgotten() -> None:
    """Seed 464865 (device plugin, 30 min): chip 1's XID 48 maybe forgotten at 1708.2; chip 2 got MC at 1728.2, and
    at 1728.3 the node's allocatable, 6, still counted chip 2 (the agent had not said it yet) and not chip 1, which
    the agent remembered at its reset limit. Taken as chip 1 in service, the model forgot it, expected it reset at
    its next XID and reported it never healed."""
    broken: list = []
    model = windows.Windows(broken)
    model.add(1, 1668.9, "reset", "XID 48")
    model.forget_xids(1708.2, "the node-health record made unreadable")
    model.add(2, 1728.2, "reset", "health MC")
    assert not model.counted_in(6, 1, 1728.3, split_replicas_2)
    model.seen_back(1728.3, lambda chip: model.counted_in(6, chip, 1728.3, split_replicas_2))
    assert any(window[0] == 1 for window in model.open)
    settled = 1728.2 + windows.STATUS_LAG_S + 1  # the node's allocatable shows chip 2 out by now
    assert not model.counted_in(4, 1, settled, split_replicas_2)  # chips 0 and 3
    assert model.counted_in(6, 1, settled, split_replicas_2)  # chips 0, 1 and 3: the agent forgot chip 1
    assert model.counted_in(8, 1, 1728.3, split_replicas_2)  # every chip: chip 1 with them


def test_a_return_of_a_chip_only_back_on_the_bus_is_no_certain_request_and_its_resets_may_count() -> None:
    """Seed 464865: chip 1 back on the bus at 1456.2 and returned at 1456.5; the agent saw it back first (the chip
    not present no longer stood) and took the return for no request, so its next reset (1487.6) was its own and
    counted, and with the one at 1572.6 chip 1 was at its limit at XID 48 (1668.9). The model took the return for
    certain, the reset for the operator's, and expected a reset that the limit rightly forbade."""
    broken: list = []
    model = windows.Windows(broken)
    counts = limits.ResetCounts(4)
    model.add(1, 1446.0, "return", "fell off the bus")
    assert not model.waits_for_return(1, present=True)
    counts.returned(1, 1456.5, model.waits_for_return(1, present=True))
    for fault, ended in ((1463.2, 1487.6), (1570.3, 1572.6)):
        assert counts.fault(1, fault, set()) == limits.RESET
        assert not counts.reset_seen(1, healed=True)
        counts.healed(1, ended)
    assert counts.fault(1, 1668.9, set()) == limits.EITHER  # the soak's operator returns it: healed either way
    model.add(3, 1500.0, "return", "fell off the bus")
    model.add(3, 1501.0, "return", "XID 64")
    assert model.waits_for_return(3, present=True)  # an XID that needs an operator: the agent waits for the return


def test_xids_a_process_may_have_been_sent_after_the_reset_that_healed_them_are_not_held_against_it() -> None:
    """A reset the soak saw late, while a rollout's new pod may have taken over (and begun listening): the XIDs the
    file still listed may have reached it, so its chip is not expected back until the XID's cure or seen in
    service; nothing of it is judged broken either."""
    assert windows.listening_began([(428.0, None)], 437.5)  # a rollout under way
    assert windows.listening_began([(428.0, 451.0)], 437.5)
    assert not windows.listening_began([(428.0, 451.0), (300.0, 309.0)], 452.0)  # done before the reset ended
    broken: list = []
    model = windows.Windows(broken)
    model.maybe_sent_again(1, 437.5, [48, 64], (64,))
    assert model.open == [(1, 437.5, "return", "XID 48; XID 64; maybe sent again after the reset")]
    model.maybe_sent_again(2, 437.5, [61], (64,))
    assert model.open[-1] == (2, 437.5, "reset", "XID 61; maybe sent again after the reset")
    assert (
        all(b.maybe for b in broken) and not model.certainly_broken(1) and not model.waits_for_return(1, present=True)
    )
    assert not checker.healthy_since(1, 437.5 + checker.BOUND_S + 1, broken, [])
    assert model.still_broken_xids() == {}  # a new process is not sent them again
    model.seen_back(437.5 + windows.SEEN_AFTER_S + 1, lambda chip: True)
    assert model.open == [] and all(b.until == 437.5 + windows.SEEN_AFTER_S + 1 for b in broken)


def test_a_forgotten_xid_that_may_have_been_left_to_an_operator_is_still_returned() -> None:
    broken: list = []
    model = windows.Windows(broken)
    model.add(1, 10.0, "either", "XID 48")  # maybe past the reset limit: the soak's operator returns it
    model.forget_xids(FORGOTTEN_AT, "unreadable")
    assert model.open == [(1, FORGOTTEN_AT, "either", "XID 48; maybe forgotten")]


def test_a_chip_that_broke_while_the_api_server_was_down_may_be_given_until_just_after_it_is_back() -> None:
    """Seed 845231 (DRA): chip 0 overheated at 1691.8 as the API server restarted (1691.7 - 1700.2); the scheduler
    gave it to soak-197 at 1703.2 from the slice the driver could not yet taint. A grace from the server's return
    covers it; an allocation after that grace, or of a chip that broke after the server was back, is a violation."""
    broken = [
        checker.Broken(0, 1691.8, 1711.8, "health OverTemp, cooled"),
        checker.Broken(1, 1701.0, None, "XID 48"),
    ]
    invariant = checker.Invariant("broken not given")
    allocations = [
        checker.NewAllocation("soak-197", frozenset({0}), 1701.1, 1711.5),
        checker.NewAllocation("late", frozenset({0}), 1704.0, 1705.0),
        checker.NewAllocation("after-back", frozenset({1}), 1704.5, 1705.0),
    ]
    checker.broken_not_given(invariant, allocations, broken, [(1691.7, 1700.2)])
    assert [v[1].split()[0] for v in invariant.violations] == ["late", "after-back"]
    unexcused = checker.Invariant("broken not given")
    checker.broken_not_given(unexcused, allocations[:1], broken)
    assert len(unexcused.violations) == 1


def test_a_chip_seen_in_service_while_the_mode_is_switched_away_is_not_taken_for_forgotten() -> None:
    """While the node runs the other mode, the DRA view reads the slices the last driver left (the kubelet wipes them
    late), from before the XID: seen in service there says nothing of what the agent remembers. The driver of the
    switch back was rightly sent the XID again and refused its device; taking the XID for forgotten made that
    refusal a violation."""
    broken, model = forgotten_xid()
    away = [(FORGOTTEN_AT + 1, FORGOTTEN_AT + 25)]
    for at in (FORGOTTEN_AT + windows.SEEN_AFTER_S + 1, FORGOTTEN_AT + 25 + windows.AWAY_AFTER_S):
        model.seen_back(at, lambda chip: True, away)
        assert any(window[0] == 1 for window in model.open), at
    assert not checker.healthy_since(1, FORGOTTEN_AT + 60, broken, [])
    model.seen_back(FORGOTTEN_AT + 25 + windows.AWAY_AFTER_S + 1, lambda chip: True, away)
    assert [window[0] for window in model.open] == [2]
