"""The chaos soak's pure parts (e2e/soak/): its schedule is a function of the seed, its checker reads nothing of the
agent, and each invariant reports a violation when the history shows one."""

from __future__ import annotations

import hashlib
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.soak_modules import SOAK, imported_modules, load

schedule = load("schedule")
checker = load("checker")


def describe(steps: list) -> list[str]:
    return [step.describe() for step in steps]


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    for mode in schedule.MODES:
        first = schedule.draw(7, 3, mode)
        assert describe(first) == describe(schedule.draw(7, 3, mode))
        assert describe(first) != describe(schedule.draw(8, 3, mode))


def test_a_schedule_draws_every_kind_of_its_mode_in_three_minutes_and_ends_before_the_soak() -> None:
    for mode in schedule.MODES:
        steps = schedule.draw(3, 3, mode)
        assert schedule.kinds_used(steps) == set(schedule.kinds_of(mode))
        assert all(step.at + step.duration < 3 * 60 for step in steps)
        assert [s.at for s in steps] == sorted(s.at for s in steps)


def test_a_soak_of_three_minutes_or_more_switches_the_node_to_the_other_mode_and_back_in_time() -> None:
    for mode in schedule.MODES:
        for minutes in (0.5, 1, 2.9):
            assert [s for s in schedule.draw(5, minutes, mode) if s.kind == schedule.MODE_SWITCH] == []
        for minutes, count in ((3, 1), (30, 3)):
            switches = [s for s in schedule.draw(5, minutes, mode) if s.kind == schedule.MODE_SWITCH]
            assert len(switches) == count and all(s.detail == {"to": schedule.other_mode(mode)} for s in switches)
            assert all(s.at >= schedule.SWITCH_EARLIEST_S and s.at + s.duration <= minutes * 60 - 15 for s in switches)
            ends = [s.at + s.duration for s in switches]
            assert all(end < later.at for end, later in zip(ends, switches[1:], strict=False)), "switches overlap"


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32), minutes=st.floats(min_value=3, max_value=240))
def test_a_switch_starts_only_once_the_last_one_is_over_and_back(seed: int, minutes: float) -> None:
    """Seed 577691 (30 min, DRA) drew two switches 19.7 s apart: the second began while the first was still away,
    and the soak's model of the time away never ended."""
    for mode in schedule.MODES:
        switches = [s for s in schedule.draw(seed, minutes, mode) if s.kind == schedule.MODE_SWITCH]
        assert switches, (seed, minutes, mode)
        assert all(s.at + s.duration <= minutes * 60 - 15 for s in switches)
        for last, later in itertools.pairwise(switches):
            assert later.at >= round(last.at + last.duration + schedule.SWITCH_TAKES_S, 1), (seed, minutes, mode)


def test_a_regression_seed_draws_the_faults_it_found_its_defect_with() -> None:
    """The schedule a regression seed replays (e2e/soak/regression-seeds.txt) stays the one that found its defect:
    the mode switch, drawn later, comes on a stream of its own. A change of the draw that changes these must
    re-run each seed for its length and say so in that file."""
    pinned = {(1, "device-plugin"): "be51deedcf9a3753", (20261205, "device-plugin"): "4841a87f24e61983"}
    for (seed, mode), digest in pinned.items():
        steps = [s for s in schedule.draw(seed, 30, mode) if s.kind not in schedule.OWN_STREAMS]
        text = "\n".join(step.describe() for step in steps)
        assert hashlib.sha256(text.encode()).hexdigest()[:16] == digest, (seed, mode)


def test_the_checker_and_what_it_reads_import_nothing_of_the_agent() -> None:
    """checker.py, observe.py, schedule.py and windows.py: the standard library and each other only (no
    ix_device_plugin, not even through the e2e harness)."""
    allowed = {"__future__", "ast", "json", "os", "re", "ssl", "random", "urllib.request", "collections.abc"}
    allowed |= {"dataclasses", "pathlib", "typing", ".checker"}
    for name in ("checker", "observe", "schedule", "windows"):
        imports = imported_modules(SOAK / f"{name}.py")
        assert imports <= allowed, (name, imports - allowed)


def test_devices_match_reports_a_container_that_sees_another_chip() -> None:
    invariant = checker.Invariant("devices match")
    uuids = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
    right = {"/dev/iluvatar1": "1fc:1", "/dev/itrctl": "1fc:ff"}
    env = {"IX_VISIBLE_DEVICES": "GPU-b", "ILUVATAR_COREX_VISIBLE_DEVICES": "GPU-b"}
    checker.devices_match(invariant, checker.Seen(1, "p", right, env, (frozenset({1}),)), uuids, 0x1FC, 0xFF)
    assert (invariant.checks, invariant.violations) == (1, [])
    wrong = right | {"/dev/iluvatar2": "1fc:2"}
    checker.devices_match(invariant, checker.Seen(2, "q", wrong, env, (frozenset({1}),)), uuids, 0x1FC, 0xFF)
    env_wrong = env | {"ILUVATAR_COREX_VISIBLE_DEVICES": "GPU-c"}
    checker.devices_match(invariant, checker.Seen(3, "r", right, env_wrong, (frozenset({1}),)), uuids, 0x1FC, 0xFF)
    assert invariant.checks == 3 and [v[0] for v in invariant.violations] == [2, 3]


def test_a_reset_of_a_chip_held_before_and_after_it_is_a_violation() -> None:
    invariant = checker.Invariant("no reset under a holder")
    samples = [
        checker.HoldSample(1.0, (checker.Holding("p", frozenset({0, 1})),)),
        checker.HoldSample(5.0, (checker.Holding("p", frozenset({0, 1})),)),
        checker.HoldSample(9.0, ()),
    ]
    resets = [checker.Reset(2.0, 3.0, frozenset({1}), ok=True), checker.Reset(6.0, 7.0, frozenset({0}), ok=True)]
    checker.no_reset_under_holder(invariant, resets, samples)
    assert invariant.checks == 2 and len(invariant.violations) == 1 and "chip 1" in invariant.violations[0][1]


def test_a_broken_chip_given_to_a_new_container_before_it_healed_is_a_violation() -> None:
    invariant = checker.Invariant("broken not given")
    broken = [checker.Broken(2, 10.0, 30.0, "XID 48")]
    allocations = [
        checker.NewAllocation("early", frozenset({2}), 10.0, 11.0),  # within the grace: the agent had not seen it
        checker.NewAllocation("bad", frozenset({2}), 20.0, 21.0),
        checker.NewAllocation("after", frozenset({2}), 30.5, 31.0),
        checker.NewAllocation("other", frozenset({3}), 20.0, 21.0),
    ]
    checker.broken_not_given(invariant, allocations, broken)
    assert invariant.checks == 4 and [v[1].split()[0] for v in invariant.violations] == ["bad"]


def test_a_dra_allocation_made_while_the_driver_was_away_is_judged_at_its_prepare() -> None:
    """Switched to the device plugin (away 100-180 s), the scheduler gave chip 2, broken at 150 s, from the slices
    the kubelet keeps: no agent's doing. Judged from the driver's return to the pod seen running: a chip healed
    before then is no violation, nor is a pod that never ran; one still broken when its pod runs is."""
    broken = [checker.Broken(2, 150.0, 175.0, "XID 95"), checker.Broken(3, 150.0, 300.0, "XID 95")]
    allocations = [
        checker.NewAllocation("healed", frozenset({2}), 168.0, 170.0),
        checker.NewAllocation("never-ran", frozenset({3}), 168.0, 170.0),
        checker.NewAllocation("still-broken", frozenset({3}), 169.0, 171.0),
        checker.NewAllocation("served", frozenset({3}), 200.0, 201.0),
    ]
    running = {"healed": 190.0, "still-broken": 190.0, "served": 202.0}
    given = checker.given_by_prepare(allocations, [(100.0, 180.0)], running)
    assert [(a.pod, a.after, a.seen) for a in given] == [
        ("healed", 180.0, 190.0),
        ("still-broken", 180.0, 190.0),
        ("served", 200.0, 201.0),
    ]
    invariant = checker.Invariant("broken not given")
    checker.broken_not_given(invariant, given, broken)
    assert [v[1].split()[0] for v in invariant.violations] == ["still-broken", "served"]
    unjudged = checker.Invariant("broken not given")
    checker.broken_not_given(unjudged, allocations, broken)
    assert "healed" in [v[1].split()[0] for v in unjudged.violations]  # as the scheduler's pick, it would be


def test_a_chip_long_healthy_and_not_in_service_is_a_violation() -> None:
    invariant = checker.Invariant("back in service")
    broken = [checker.Broken(0, 0.0, 10.0, "XID 48")]
    at = 10.0 + checker.BOUND_S + 1
    checker.back_in_service(invariant, checker.ServiceSample(at, in_service=frozenset({1, 2, 3})), 4, broken, [])
    assert invariant.checks == 4 and len(invariant.violations) == 1 and "chip 0" in invariant.violations[0][1]
    soon = checker.Invariant("back in service")
    checker.back_in_service(soon, checker.ServiceSample(15.0, in_service=frozenset({1, 2, 3})), 4, broken, [])
    assert soon.checks == 3 and soon.violations == []  # chip 0 is within its bound


def test_memory_or_files_over_their_bound_and_leftovers_are_violations() -> None:
    invariant = checker.Invariant("bounded")
    checker.bounded(invariant, 1, 100_000, 40)
    checker.bounded(invariant, 2, checker.MAX_RSS_KIB + 1, 40)
    checker.bounded(invariant, 3, 100_000, checker.MAX_OPEN_FILES + 1)
    assert [v[0] for v in invariant.violations] == [2, 3]
    left = checker.Invariant("nothing left")
    checker.nothing_left(left, 1, [])
    checker.nothing_left(left, 2, ["/cdi/claim-x.yaml"])
    assert left.checks == 2 and len(left.violations) == 1
