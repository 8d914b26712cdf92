"""The soak's model of the agent's reset limit and attempts (e2e/soak/limits.py), its two faults of healing
(chip-flapping, ixsmi-lying: e2e/soak/schedule.py) and the checker's rules over them, each with a violation."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.soak_modules import SoakStandIn, load

checker = load("checker")
limits = load("limits")
schedule = load("schedule")
windows = load("windows")


def test_flapping_and_lying_are_drawn_on_their_own_stream_in_soaks_long_enough() -> None:
    for mode in schedule.MODES:
        assert {schedule.FLAPPING, schedule.LYING} <= set(schedule.kinds_of(mode))
        assert not {schedule.FLAPPING, schedule.LYING} & set(schedule.drawn_kinds(mode))
        assert [s for s in schedule.draw(5, 0.5, mode) if s.kind in (schedule.FLAPPING, schedule.LYING)] == []
        for minutes, flapping, lying in ((1, 0, 1), (3, 1, 1), (30, 3, 6)):
            steps = schedule.draw(5, minutes, mode)
            flaps = [s for s in steps if s.kind == schedule.FLAPPING]
            lies = [s for s in steps if s.kind == schedule.LYING]
            assert (len(flaps), len(lies)) == (flapping, lying), (mode, minutes)
            assert all(s.at + s.duration <= minutes * 60 - 15 and len(s.chips) == 1 for s in flaps + lies)
            assert all(schedule.LYING_S[0] <= s.duration <= schedule.LYING_S[1] for s in lies)


def test_a_flapping_chip_is_healed_limit_times_then_left_to_an_operator_until_returned() -> None:
    counts = limits.ResetCounts(4)
    at = 10.0
    for _ in range(limits.LIMIT):
        assert counts.fault(1, at, set()) == limits.RESET
        assert not counts.reset_seen(1, healed=True)
        counts.healed(1, at + 2)
        at += 10
    assert counts.fault(1, at, set()) == limits.LIMITED
    assert counts.fault(1, at + 1, {"return"}) == limits.LIMITED  # the same episode
    assert counts.fault(0, at, set()) == limits.RESET  # another chip's count is its own
    counts.returned(1, at + 15, certain=True)
    assert [(s.chip, s.since, s.until) for s in counts.limited] == [(1, at, at + 15)]
    assert not counts.reset_seen(1, healed=True)  # the operator's reset: not counted
    counts.healed(1, at + 17)
    assert [(s.chip, s.since, s.until) for s in counts.returns] == [(1, at + 15, at + 17)]
    assert counts.fault(1, at + 30, set()) == limits.RESET


def test_what_the_soak_cannot_know_is_either_not_limited() -> None:
    counts = limits.ResetCounts(4)
    for at in (10.0, 20.0):
        counts.fault(2, at, set())
        counts.reset_seen(2, healed=True)
        counts.healed(2, at + 1)
    assert counts.fault(2, 22.0, set()) == limits.EITHER  # 1 s after its reset: maybe the same episode
    counts = limits.ResetCounts(4)
    for at in (10.0, 20.0):
        counts.fault(2, at, set())
        counts.reset_seen(2, healed=True)
        counts.healed(2, at + 1)
    counts.forget(25.0)  # the node-health record unreadable: the count may be gone
    assert counts.fault(2, 40.0, set()) == limits.EITHER
    assert counts.limited == []


def test_three_failed_attempts_of_one_fault_need_an_operator_and_count_once() -> None:
    counts = limits.ResetCounts(4)
    counts.fault(3, 5.0, set())
    assert [counts.reset_seen(3, healed=False) for _ in range(limits.ATTEMPTS)] == [False, False, True]
    assert (counts.chips[3].lo, counts.chips[3].hi) == (1, 1)


def test_a_reset_ending_within_a_lie_lied_and_one_by_its_edges_is_not_counted_either_way() -> None:
    """The backend reads the lie after ixsmi's end is logged, and the soak notes a lie's start and end after writing
    them: a reset ending at or after the start read it (seed 508062's chip 3: a reset 0.2 s into a lie was taken for
    an honest one, and the chip the agent rightly kept out was expected back), one ending at or after the end did
    not; one ending within a second before either may have read it or not."""
    lies = [(0, 10.0, 20.0), (1, 30.0, None)]
    assert limits.lying_at(lies, 0, 15.0) and limits.lying_at(lies, 1, 99.0) and limits.lying_at(lies, 0, 10.0)
    assert not limits.lying_at(lies, 0, 19.5) and not limits.lying_at(lies, 0, 9.5)
    assert not limits.lying_at(lies, 1, 15.0) and not limits.lying_at(lies, 2, 15.0)
    assert limits.honest_at(lies, 0, 20.0) and limits.honest_at(lies, 0, 9.0) and limits.honest_at(lies, 2, 15.0)
    assert not limits.honest_at(lies, 0, 19.5) and not limits.honest_at(lies, 0, 9.5)  # within a second before
    assert not limits.honest_at(lies, 1, 99.0)


def test_a_reset_that_may_have_read_a_lie_leaves_what_it_would_heal_in_doubt(tmp_path: Path) -> None:
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 100.0
    soak.faults.do(schedule.Step(100.0, "xid-reset", (3,), detail={"xid": 48}))
    soak.at = 101.0
    soak.faults.do(schedule.Step(101.0, schedule.LYING, (3,), 8.0))
    soak.at = 101.5
    soak.healing.reset_seen(checker.Reset(100.4, 100.5, frozenset({3}), ok=True))
    assert "chip 3: the reset ending at 100.5 may have lied (it ended by a lie's edge)" in soak.notes
    before = [(w[0], w[1], w[2]) for w in soak.windows.open if w[0] == 3 and w[1] < 101.0]  # the lie sends its own
    assert before == [(3, 100.5, "either")]
    assert (3, 100.5) in soak.windows.maybe and 3 not in soak.healing.lied


def test_an_honest_reset_after_the_lie_ends_it_though_an_xid_may_be_sent_again(tmp_path: Path) -> None:
    """Seed 717618's chip 3: ixsmi lies from 1528.5 (XID 48), two resets lie, the lie ends at 1538.8 as a rollout
    begins, the third reset (1546.6) is honest and heals the chip; the soak sees it while the new pod may begin
    listening, so XID 48 may be sent again (a window in doubt). The chip was reset: back in service is right."""
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 1528.5
    soak.faults.do(schedule.Step(1519.4, schedule.LYING, (3,), 7.7))
    for started in (1534.0, 1536.1):
        soak.at = started + 0.2
        soak.healing.reset_seen(checker.Reset(started, started + 0.1, frozenset({3}), ok=True))
    assert 3 in soak.healing.lied and 3 in soak.hardware.lying
    soak.at = 1538.8
    soak.healing.lie_over(0)
    soak.timeline.rollouts.append(checker.Rollout(1538.8, 0, "rollout to revision 36"))
    soak.at = 1546.8
    soak.healing.reset_seen(checker.Reset(1546.5, 1546.6, frozenset({3}), ok=True))
    assert "chip 3: XIDs [48] maybe sent again to a process that began listening" in soak.notes
    assert 3 not in soak.healing.lied
    invariant = soak.invariants["lying reset not trusted"]
    soak.healing.judge_lies(checker.ServiceSample(1552.8, allocatable=2))
    assert invariant.violations == []


def test_a_chip_whose_reset_lied_counted_in_allocatable_is_a_violation(tmp_path: Path) -> None:
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 100.0
    soak.faults.do(schedule.Step(100.0, schedule.LYING, (3,), 8.0))
    soak.at = 103.2
    soak.healing.reset_seen(checker.Reset(103.0, 103.1, frozenset({3}), ok=True))
    soak.at = 108.0
    soak.healing.lie_over(0)
    invariant = soak.invariants["lying reset not trusted"]
    soak.healing.judge_lies(checker.ServiceSample(103.1 + limits.LIE_LAG_S, allocatable=2))
    assert [v[0] for v in invariant.violations] == [103.1 + limits.LIE_LAG_S]
    assert "chips [3] counted after a reset that lied" in invariant.violations[0][1]


def test_a_limited_chip_reset_before_its_return_is_a_violation() -> None:
    spans = [limits.Span(1, 50.0, 65.0), limits.Span(2, 70.0, None)]
    resets = [checker.Reset(55.0, 56.0, frozenset({1}), ok=True), checker.Reset(66.0, 67.0, frozenset({1}), True)]
    resets.append(checker.Reset(80.0, 81.0, frozenset({3}), ok=True))
    invariant = checker.Invariant("reset limit")
    limits.no_reset_while_limited(invariant, resets, spans, end=100.0)
    assert invariant.checks == 2 and [v[0] for v in invariant.violations] == [50.0]
    assert "reset at 55.0" in invariant.violations[0][1]


def test_a_returned_chip_reset_more_than_once_before_it_healed_is_a_violation() -> None:
    spans = [limits.Span(1, 65.0, 70.0), limits.Span(2, 80.0, 95.0)]
    resets = [checker.Reset(66.0, 67.0, frozenset({1}), ok=True)]
    resets += [checker.Reset(81.0, 83.0, frozenset({2})), checker.Reset(90.0, 91.0, frozenset({2}), ok=True)]
    invariant = checker.Invariant("reset limit")
    limits.one_reset_per_return(invariant, resets, spans, end=100.0)
    assert invariant.checks == 2 and [v[0] for v in invariant.violations] == [80.0]


def test_a_chip_back_in_service_after_a_lying_reset_is_a_violation() -> None:
    invariant = checker.Invariant("lying reset not trusted")
    limits.not_back_while_lying(
        invariant, checker.ServiceSample(40.0, in_service=frozenset({0, 2, 3})), frozenset({1}), None
    )
    limits.not_back_while_lying(
        invariant, checker.ServiceSample(41.0, in_service=frozenset({0, 1})), frozenset({1}), None
    )
    limits.not_back_while_lying(invariant, checker.ServiceSample(42.0, allocatable=3), frozenset({1}), 3)
    limits.not_back_while_lying(invariant, checker.ServiceSample(43.0, allocatable=4), frozenset({1}), 3)
    limits.not_back_while_lying(invariant, checker.ServiceSample(44.0, allocatable=4), frozenset(), 3)
    assert invariant.checks == 4 and [v[0] for v in invariant.violations] == [41.0, 43.0]


def test_a_reset_in_no_episode_the_soak_knows_may_have_counted_so_the_next_fault_may_find_the_limit() -> None:
    counts = limits.ResetCounts(2)
    assert counts.fault(0, 5.0, set()) == limits.RESET
    counts.reset_seen(0, healed=True)
    counts.healed(0, 18.2)
    counts.unexplained(0)  # an XID sent again to a new agent process: an episode of the agent's own, maybe counted
    assert (
        counts.fault(0, 39.1, set()) == limits.EITHER
    )  # healed by a reset, or left to the soak's operator: not judged
    assert counts.fault(1, 39.1, set()) == limits.RESET  # the other chip's count is its own


def back_on_the_bus(model: object, counts: object, chip: int, at: float, present: bool = True) -> None:
    """The soak's operator returns a chip that fell off the bus, as faults.py does once it is back (or not yet)."""
    counts.returned(chip, at, model.waits_for_return(chip, present))
    model.close(lambda ch, since, by, why: ch == chip and why.startswith(windows.OFF_BUS), at, "returned")


def test_a_chip_back_on_the_bus_may_be_reset_by_the_agent_before_the_return_so_its_count_is_not_known() -> None:
    """Seed 621430, chip 3: reset once (1679.3), off the bus at 1699 with XIDs 46 and 62 meanwhile, back at 1704.0
    and returned at once. The agent saw it present first and reset it for its XIDs as its own (counted: 2), then
    ignored the return (the chip waited for none); at the ECC error of 1717 the limit left it to an operator. The
    soak took the return as certain (count cleared) and waited for a reset that could not come."""
    counts, model = limits.ResetCounts(4), windows.Windows([])
    assert counts.fault(3, 1622.1, set()) == limits.RESET
    counts.reset_seen(3, healed=True)
    counts.healed(3, 1679.3)
    model.add(3, 1699.0, "return", windows.OFF_BUS)
    assert counts.fault(3, 1700.0, {"return"}) == limits.RESET
    model.add(3, 1700.0, "reset", "XID 46")
    assert not model.waits_for_return(3, present=True)
    back_on_the_bus(model, counts, 3, 1704.0)
    counts.reset_seen(3, healed=True)  # the agent's own reset, or the one the return asked for
    counts.healed(3, 1704.2)
    assert counts.fault(3, 1717.0, set()) == limits.EITHER  # reset, or left to the operator: returned later


def test_a_return_while_the_chip_is_off_the_bus_or_needs_an_operator_for_more_is_certain() -> None:
    model = windows.Windows([])
    model.add(1, 10.0, "return", windows.OFF_BUS)
    assert model.waits_for_return(1, present=False)
    model.add(1, 11.0, "return", "XID 64")
    assert model.waits_for_return(1, present=True)  # XID 64 keeps it out until the return, on the bus or not
    assert not model.waits_for_return(0, present=True)
    counts = limits.ResetCounts(2)
    for at in (1.0, 5.0):
        counts.fault(1, at, set())
        counts.reset_seen(1, healed=True)
        counts.healed(1, at + 1)
    back_on_the_bus(model, counts, 1, 20.0)
    counts.reset_seen(1, healed=True)  # the operator's: not counted, the count cleared
    counts.healed(1, 20.5)
    assert counts.fault(1, 40.0, set()) == limits.RESET


def test_a_reset_of_an_xid_maybe_sent_again_to_a_new_process_may_count_for_the_limit(tmp_path: Path) -> None:
    """Seed 7 (DRA, `make e2e`): chip 1's XID 63 (5.0), the agent killed at 18.0 as it reset the chip (ending at
    18.1); the new process, starting, was sent the XID again, took it for a new fault and reset the chip again
    (19.1), counting both resets. SYSHUB at 39.4 then found the chip at its reset limit and the agent left it to an
    operator; the soak, counting one reset, waited for a reset that never came. The reset of an XID maybe sent again
    may count: the chip may be at its limit, and the soak's operator returns it."""
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 5.0
    soak.faults.xid(1, 63, "xid-reset")
    soak.timeline.starts.append((18.0, 26.4))  # the agent killed, its new process Ready at 26.4
    soak.at = 26.4
    soak.healing.reset_seen(checker.Reset(18.0, 18.1, frozenset({1}), ok=True))
    assert "chip 1: XIDs [63] maybe sent again to a process that began listening" in soak.notes
    soak.healing.reset_seen(checker.Reset(19.0, 19.1, frozenset({1}), ok=True))
    assert not soak.healing.is_open(1)
    soak.at = 39.4
    soak.healing.resettable(1, "health SYSHUB")
    assert "chip 1: health SYSHUB maybe after the reset limit" in soak.notes
    assert len(soak.later.due) == 1  # the soak's operator returns it RETURN_AFTER_S later


def test_a_lie_no_reset_met_goes_on_until_the_first_reset_lies_in_it(tmp_path: Path) -> None:
    """In 37 DRA soaks no lie was judged: a container held the chip, or the reset limit kept it, until the lie's
    5-12 s were over. A lie ends once a reset of its chip lied in it, LIE_WAIT_S after its end at the latest."""
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 100.0
    soak.faults.do(schedule.Step(100.0, schedule.LYING, (3,), 8.0))
    for at in (108.0, 109.0, 120.0):
        soak.at = at
        soak.later.run_due(at)
    assert 3 in soak.hardware.lying and not soak.healing.lie_caught(0)
    soak.healing.reset_seen(checker.Reset(119.5, 119.6, frozenset({3}), ok=True))
    assert soak.healing.lie_caught(0) and 3 in soak.healing.lied
    soak.at = 121.0
    soak.later.run_due(121.0)
    assert 3 not in soak.hardware.lying and "chip 3's resets honest again" in soak.notes
    assert not soak.later.pending


def test_a_lie_no_reset_meets_ends_after_its_wait_and_at_the_soaks_end(tmp_path: Path) -> None:
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 100.0
    soak.faults.do(schedule.Step(100.0, schedule.LYING, (3,), 8.0))
    soak.faults.do(schedule.Step(100.0, schedule.LYING, (1,), 8.0))
    while soak.at < 108.0 + schedule.LIE_WAIT_S - 1:
        soak.at += 1.0
        soak.later.run_due(soak.at)
    assert soak.hardware.lying == {1, 3}
    soak.at += 1.0
    soak.later.run_due(soak.at)
    assert soak.hardware.lying == set() and not soak.later.pending
    soak.faults.do(schedule.Step(200.0, schedule.LYING, (2,), 8.0))
    soak.later.finish()
    assert soak.hardware.lying == set()


def test_a_lie_is_judged_while_what_it_left_broken_lasts_not_over_a_later_fault(tmp_path: Path) -> None:
    """Seed 580223's chip 0: ixsmi lied over XID 48; what it left broken ended without an honest reset (here: the
    node-health record made unreadable, the XID forgotten and the chip seen in service). At 754.1 the chip fell off
    the bus: a fault of its own, not what the lie left, and no violation of the lie."""
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 637.2
    soak.faults.do(schedule.Step(637.2, schedule.LYING, (0,), 8.8))
    soak.at = 638.3
    soak.healing.reset_seen(checker.Reset(637.9, 638.0, frozenset({0}), ok=True))
    assert 0 in soak.healing.lied
    soak.at = 640.0
    soak.healing.forget_all("the node-health record made unreadable")
    soak.at = 646.0
    soak.healing.lie_over(0)
    soak.windows.seen_back(651.0, lambda chip: True)
    invariant = soak.invariants["lying reset not trusted"]
    soak.healing.judge_lies(checker.ServiceSample(651.0, allocatable=2))
    soak.at = 754.1
    soak.faults.do(schedule.Step(754.1, "off-bus", (0,), 12.8))
    soak.healing.judge_lies(checker.ServiceSample(754.1, allocatable=2))
    assert invariant.violations == [] and soak.healing.lied == {}


def test_a_second_lie_of_a_chip_is_judged_from_its_own_reset(tmp_path: Path) -> None:
    """The lie of an episode that ended is not kept: a later lie over a later fault is judged from its own reset."""
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    for index, begins in enumerate((100.0, 300.0)):
        soak.at = begins
        soak.faults.do(schedule.Step(begins, schedule.LYING, (3,), 8.0))
        soak.at = begins + 3.2
        soak.healing.reset_seen(checker.Reset(begins + 3.0, begins + 3.1, frozenset({3}), ok=True))
        assert soak.healing.lied == {3: begins + 3.1}
        soak.at = begins + 8.0
        soak.healing.lie_over(index)
        if index == 0:  # an honest reset heals the first episode
            soak.healing.reset_seen(checker.Reset(begins + 20.0, begins + 20.1, frozenset({3}), ok=True))
            soak.healing.judge_lies(checker.ServiceSample(begins + 21.0, allocatable=2))
            assert soak.healing.lied == {}
    invariant = soak.invariants["lying reset not trusted"]
    soak.healing.judge_lies(checker.ServiceSample(303.1 + limits.LIE_LAG_S, allocatable=2))
    assert [v[0] for v in invariant.violations] == [303.1 + limits.LIE_LAG_S]


def test_the_reset_an_operator_asked_for_over_a_health_bit_is_unproven_and_a_fault_since_waits_for_a_return(
    tmp_path: Path,
) -> None:
    """Seed 149631 (device plugin): chip 2 was returned with MC set; ixsmi succeeded, but the soak clears a reset
    chip's bits only as it sees the reset, after the agent read MC still set: the proof failed, the reset the
    operator asked for spent. XID 62 came before the soak saw the reset, and the agent rightly left it to an
    operator; the soak waited for a reset the agent would never make. Seed 529572 (DRA): with no fault in between,
    the reset cleared the XIDs and the chip came back once its bits cleared."""
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 100.0
    soak.faults.do(schedule.Step(100.0, "xid-reset", (2,), detail={"xid": 48}))
    soak.faults.do(schedule.Step(100.0, "health-reset-bit", (2,), detail={"bit": "MC"}))
    soak.at = 110.0
    soak.healing.counts.returned(2, 110.0, certain=True)
    soak.at = 111.3
    soak.faults.do(schedule.Step(111.3, "xid-reset", (2,), detail={"xid": 62}))  # after the reset, before it is seen
    soak.at = 111.5
    soak.healing.reset_seen(checker.Reset(111.0, 111.1, frozenset({2}), ok=True))
    assert "chip 2: the reset an operator asked for read MC still set: not proven" in soak.notes
    assert [(w[2], w[3]) for w in soak.windows.open if w[0] == 2] == [("return", "XID 62")]
    assert "MC" not in soak.hardware.bits.get(2, set()) and soak.later.pending


def test_the_unproven_reset_with_no_fault_since_heals_what_it_reset(tmp_path: Path) -> None:
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 100.0
    soak.faults.do(schedule.Step(100.0, "xid-operator", (2,), 5.0, detail={"xid": 64}))
    soak.faults.do(schedule.Step(100.0, "health-reset-bit", (2,), detail={"bit": "ECC"}))
    soak.at = 110.0
    soak.healing.counts.returned(2, 110.0, certain=True)
    soak.windows.awaits_reset(2, 110.0)
    soak.at = 111.5
    soak.healing.reset_seen(checker.Reset(111.0, 111.1, frozenset({2}), ok=True))
    assert "chip 2: the reset an operator asked for read ECC still set: not proven" in soak.notes
    assert [w for w in soak.windows.open if w[0] == 2] == [] and soak.windows.still_broken_xids() == {}


def test_an_automatic_reset_over_a_health_bit_heals_as_before(tmp_path: Path) -> None:
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.at = 100.0
    soak.faults.do(schedule.Step(100.0, "xid-reset", (2,), detail={"xid": 62}))
    soak.faults.do(schedule.Step(100.0, "health-reset-bit", (2,), detail={"bit": "MC"}))
    soak.at = 101.5
    soak.healing.reset_seen(checker.Reset(101.0, 101.1, frozenset({2}), ok=True))
    assert [w for w in soak.windows.open if w[0] == 2] == [] and not any("not proven" in n for n in soak.notes)
