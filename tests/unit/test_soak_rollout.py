"""The soak's "kept in a rollout" invariant (e2e/soak/checker.py): histories with and without a violation."""

from __future__ import annotations

from tests.helpers.soak_modules import load

checker = load("checker")


def judge(rollout: object, samples: list[object], broken: list[object], quiet: list[tuple[float, float]]) -> object:
    invariant = checker.Invariant("kept in a rollout")
    for sample in samples:
        checker.kept_in_rollout(invariant, rollout, sample, broken, quiet, lambda out: 2 * (4 - len(out)))
    return invariant


def test_a_rollout_taking_a_chip_out_of_the_slice_is_a_violation_and_one_a_fault_took_out_is_not() -> None:
    rollout = checker.Rollout(10.0, frozenset({0, 1, 2, 3}), "rollout to revision 2", done=20.0)
    up = frozenset({0, 1, 2, 3})
    samples = [checker.ServiceSample(t, in_service=up) for t in (9.0, 11.0, 12.0)]
    samples.append(checker.ServiceSample(13.0, in_service=frozenset({1, 2, 3})))  # chip 0 gone in the handover
    samples.append(checker.ServiceSample(25.0, in_service=frozenset({0, 1, 2})))  # chip 3: an XID since the start
    samples.append(checker.ServiceSample(31.0, in_service=frozenset()))  # over: done + the bound
    invariant = judge(rollout, samples, [checker.Broken(3, 24.0, None, "XID 48")], [])
    assert invariant.checks == 4, invariant  # 11, 12, 13, 25: not before it, not after its bound
    assert [at for at, _ in invariant.violations] == [13.0]
    assert "chips [0] out of service" in invariant.violations[0][1]


def test_allocatable_dropping_in_a_rollout_is_a_violation_unless_a_fault_took_the_chips_out() -> None:
    rollout = checker.Rollout(10.0, 8, "rollback to revision 3")  # not done yet: judged on
    samples = [checker.ServiceSample(t, allocatable=8) for t in (11.0, 12.0)]
    samples += [checker.ServiceSample(13.0, allocatable=0)]  # the old pod gone before the new one registered
    samples += [checker.ServiceSample(40.0, allocatable=6)]  # chip 2 broken since: 2 replicas of 3 chips
    invariant = judge(rollout, samples, [checker.Broken(2, 30.0, None, "XID 64")], [])
    assert invariant.checks == 4 and [at for at, _ in invariant.violations] == [13.0]
    assert "allocatable 0 < 8" in invariant.violations[0][1]


def test_a_rollout_overlapping_an_agent_or_kubelet_restart_is_not_judged_meanwhile() -> None:
    rollout = checker.Rollout(10.0, 8, "rollout to revision 2", done=20.0)
    samples = [checker.ServiceSample(13.0, allocatable=0)]
    invariant = judge(rollout, samples, [], [(12.0, 14.0)])
    assert (invariant.checks, invariant.violations) == (0, [])


def test_a_whole_board_shared_as_one_device_goes_out_with_either_chip() -> None:
    """Seed 4242 (DRA, 1 minute): boards shared whole, chip 3's fault taints board 2, so chip 2 leaves service with it;
    a chip of another board going out is still a violation."""
    rollout = checker.Rollout(22.0, frozenset({2, 3}), "rollout to revision 2", done=30.0)
    broken = [checker.Broken(3, 33.1, 34.1, "health MC")]
    boards = [frozenset({0, 1}), frozenset({2, 3})]
    invariant = checker.Invariant("kept in a rollout")
    sample = checker.ServiceSample(34.0, in_service=frozenset({0, 1}))
    checker.kept_in_rollout(invariant, rollout, sample, broken, [], None, boards)
    assert invariant.checks == 1 and invariant.violations == []
    unjudged = checker.Invariant("kept in a rollout")
    checker.kept_in_rollout(unjudged, rollout, sample, broken, [], None)
    assert "chips [2] out of service" in unjudged.violations[0][1]
    other = checker.Invariant("kept in a rollout")
    rollout_all = checker.Rollout(22.0, frozenset({0, 1, 2, 3}), "rollout to revision 2", done=30.0)
    checker.kept_in_rollout(other, rollout_all, checker.ServiceSample(34.0, in_service=frozenset()), broken, [], None,
                            boards)  # fmt: skip
    assert "chips [0, 1] out of service" in other.violations[0][1]
