"""Self-healing's rules: each chip's story from what is seen and done, with the clock given."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core import healing
from ix_device_plugin.core.healing import (
    HEALTHY,
    NEEDS_OPERATOR,
    OFF,
    OUT,
    RESETTING,
    WAITING,
    Care,
    Diagnosis,
    Rules,
    diagnose,
)
from ix_device_plugin.core.holding import chip_holder
from ix_device_plugin.core.inventory import Board, Chip, ChipStatus, Inventory
from ix_device_plugin.core.telemetry import ClaimDevice, Holdings, PodRef
from ix_device_plugin.settings.health import HealthPolicy

pytestmark = pytest.mark.unit
RULES = Rules(attempts=3, backoff=10.0, backoff_cap=25.0, refused_wait=60.0, settle=1.0)
POLICY = HealthPolicy()
XID48 = Diagnosis(resettable=("XID 48",))
WALL = 1_700_000_000.0  # a Unix time: when a reset started


def test_reasons_are_sorted_by_what_is_done_about_them() -> None:
    status = ChipStatus(errors=frozenset({"ECC", "OverTemp"}), problems=("device node /dev/iluvatar1 missing",),
                        xids=frozenset({13, 48, 79}))  # fmt: skip
    assert diagnose(status, POLICY) == Diagnosis(
        resettable=("ECC", "XID 48"), operator=("OverTemp", "XID 79"), other=("device node /dev/iluvatar1 missing",)
    )
    assert diagnose(ChipStatus(present=False), POLICY).operator == ("not present",)
    assert diagnose(ChipStatus(xids=frozenset({48})), HealthPolicy(disabled=frozenset({"xids"}))).healthy


def test_a_resettable_error_waits_the_settling_time_then_is_due() -> None:
    care = healing.observe(Care("GPU-a", 1), XID48, now=100.0, rules=RULES, healing=True)
    assert (care.phase, care.causes, care.out_since) == (WAITING, ("XID 48",), 100.0)
    assert not healing.due(care, 100.5) and healing.due(care, 101.0)
    assert care.name == "GPU 1 (GPU-a)"


def test_a_held_chip_is_looked_at_again_later() -> None:
    care = healing.observe(Care("GPU-a", 1), XID48, 100.0, RULES, True)
    held = healing.held(care, "ml/trainer (main)", look_again=103.0)
    assert held.phase == WAITING and "held by ml/trainer (main)" in held.note
    assert not healing.due(held, 102.0) and healing.due(held, 103.0)


def test_a_reset_that_works_returns_the_chip() -> None:
    care = healing.started(healing.observe(Care("GPU-a", 1), XID48, 100.0, RULES, True), WALL)
    assert (care.phase, care.attempts) == (RESETTING, 1)
    assert healing.observe(care, Diagnosis(), 101.0, RULES, True) is care  # a reset under way keeps its phase
    back = healing.reset_done(care, Diagnosis(), 102.0, RULES)
    assert back == Care("GPU-a", 1, note="back in service after a reset (attempt 1)", resets=(WALL,))


def test_failures_back_off_then_need_an_operator() -> None:
    care = healing.observe(Care("GPU-a", 1), XID48, 0.0, RULES, True)
    delays = []
    for attempt in range(1, 4):
        now = care.retry_at
        care = healing.failed(healing.started(care, WALL), "ixsmi exited with code 3", now, RULES)
        delays.append(care.retry_at - now)
        if attempt < 3:
            assert care.phase == WAITING and f"next attempt in {care.retry_at - now:g}s" in care.note
    assert care.phase == NEEDS_OPERATOR and care.attempts == 3
    assert care.note == "needs an operator: 3 resets failed: ixsmi exited with code 3"
    assert delays[:2] == [10.0, 20.0]
    assert healing.observe(care, XID48, 1000.0, RULES, True).phase == NEEDS_OPERATOR  # no fourth attempt by itself


def test_still_unhealthy_after_a_reset_counts_as_a_failed_attempt() -> None:
    care = healing.started(healing.observe(Care("GPU-a", 1), XID48, 0.0, RULES, True), WALL)
    after = healing.reset_done(care, Diagnosis(resettable=("ECC",)), 5.0, RULES)
    assert after.phase == WAITING and after.causes == ("ECC",) and "still unhealthy after the reset: ECC" in after.note


def test_a_refused_reset_is_not_an_attempt() -> None:
    care = healing.started(healing.observe(Care("GPU-a", 1), XID48, 0.0, RULES, True), WALL)
    refused = healing.refused(care, "ix-exporter did not let go", 5.0, RULES)
    assert (refused.phase, refused.attempts, refused.retry_at) == (WAITING, 0, 65.0)


def test_a_reset_refused_before_it_started_takes_back_no_attempt() -> None:
    """The node's reset turn or the record's write failing (a full disk) refuses a reset that never started: the
    attempts stay what they were, never below 0 (the record's reader refuses a negative count, whole)."""
    waiting = healing.observe(Care("GPU-a", 1), XID48, 0.0, RULES, True)
    refused = healing.refused(waiting, "the node-health record: No space left on device", 5.0, RULES)
    assert (refused.phase, refused.attempts) == (WAITING, 0)
    again = healing.refused(refused, "the node-health record: No space left on device", 70.0, RULES)
    assert again.attempts == 0
    tried = healing.failed(healing.started(waiting, WALL), "ixsmi failed", 6.0, RULES)
    assert healing.refused(tried, "the node's reset turn", 30.0, RULES).attempts == 1


@given(st.lists(st.sampled_from(["observe", "started", "failed", "refused", "done"]), max_size=30))
def test_no_sequence_of_events_makes_a_negative_count_of_attempts(events: list[str]) -> None:
    care = Care("GPU-a", 1)
    for now, event in enumerate(events):
        if event == "observe":
            care = healing.observe(care, XID48, float(now), RULES, True)
        elif event == "started" and care.phase == WAITING:
            care = healing.started(care, WALL)
        elif event == "failed" and care.phase == RESETTING:
            care = healing.failed(care, "ixsmi failed", float(now), RULES)
        elif event == "refused" and care.phase in (WAITING, RESETTING):
            care = healing.refused(care, "refused", float(now), RULES)
        elif event == "done" and care.phase == RESETTING:
            care = healing.reset_done(care, Diagnosis(), float(now), RULES)
        assert care.attempts >= 0, events


def test_an_operator_error_is_never_reset_and_an_operator_gets_one_more_try() -> None:
    care = healing.observe(Care("GPU-a", 1), Diagnosis(operator=("XID 79",)), 0.0, RULES, True)
    assert care.phase == NEEDS_OPERATOR and care.note == "needs an operator: XID 79"
    asked = healing.operator_asked(care)
    assert asked.phase == WAITING and asked.operator_return and healing.due(asked, 0.0)
    assert healing.observe(asked, Diagnosis(operator=("XID 79",)), 1.0, RULES, True) == asked
    again = healing.failed(healing.started(asked, WALL), "ixsmi failed", 2.0, RULES)
    assert again.phase == NEEDS_OPERATOR and "the reset an operator asked for failed" in again.note
    assert healing.operator_asked(Care("GPU-b")) == Care("GPU-b")  # in service: nothing to return


def test_an_operators_return_covers_what_the_chip_had_when_they_asked_not_what_came_after() -> None:
    care = healing.observe(Care("GPU-a", 1), Diagnosis(operator=("XID 64",)), 0.0, RULES, True)
    asked = healing.operator_asked(care)
    assert asked.returned_for == ("XID 64",)
    assert healing.not_returned(asked, Diagnosis(resettable=("XID 48",), operator=("XID 64",))) == ()
    late = healing.not_returned(asked, Diagnosis(operator=("XID 64", "XID 79")))
    assert late == ("XID 79",)
    again = healing.returned_too_early(asked, late)
    assert again.phase == NEEDS_OPERATOR and not again.operator_return and again.returned_for is None
    assert again.note == "needs an operator: XID 79 reported since an operator asked to return it"
    unknown = replace(asked, returned_for=None)  # the return of an agent that did not record what it covered
    assert healing.not_returned(unknown, Diagnosis(operator=("XID 79",))) == ()
    assert healing.not_returned(care, Diagnosis(operator=("XID 79",))) == ()  # no return pending


def test_other_problems_and_self_healing_off() -> None:
    out = healing.observe(Care("GPU-a"), Diagnosis(other=("device node /dev/iluvatar0 missing",)), 0.0, RULES, True)
    assert out.phase == OUT
    off = healing.observe(Care("GPU-a"), XID48, 0.0, RULES, healing=False)
    assert off.phase == OFF
    assert healing.observe(off, XID48, 1.0, RULES, healing=True).phase == WAITING  # switched on: it is healed
    assert healing.observe(off, Diagnosis(), 1.0, RULES, healing=False).phase == HEALTHY


@given(st.lists(st.sampled_from(["ok", "failed", "refused", "still", "healthy", "sick", "operator"]), max_size=40))
def test_resets_never_exceed_the_bound_but_for_an_operators_asking(steps: list[str]) -> None:
    care, now, resets, allowed = Care("GPU-a"), 0.0, 0, RULES.attempts
    for step in steps:
        now += 1000.0
        care = healing.observe(care, XID48 if step != "healthy" else Diagnosis(), now, RULES, True)
        if care.phase == HEALTHY:
            resets, allowed = 0, RULES.attempts  # a new episode
        if step == "operator" and healing.operator_asked(care) != care:
            care, allowed = healing.operator_asked(care), allowed + 1
        if not healing.due(care, now):
            continue
        care, resets = healing.started(care, WALL), resets + 1
        if step == "failed":
            care = healing.failed(care, "no", now, RULES)
        elif step == "refused":
            care, resets = healing.refused(care, "no", now, RULES), resets - 1
        else:
            care = healing.reset_done(care, Diagnosis() if step == "ok" else XID48, now, RULES)
        assert resets <= allowed
        assert care.phase in (HEALTHY, WAITING, NEEDS_OPERATOR)
        if care.phase == HEALTHY:
            resets, allowed = 0, RULES.attempts


def test_who_holds_a_chip_follows_boards_replicas_and_any_resource_name() -> None:
    chips = (Chip("GPU-a0", 0, "BI-V150"), Chip("GPU-a1", 1, "BI-V150"))
    inventory = Inventory((Board("BI-V150", chips),))
    pod = PodRef("ml", "trainer", "main")

    def holder(uuid: str, *devices: tuple[str, str], split_only: bool = False) -> PodRef | None:
        held = Holdings(devices=tuple((name, device, pod) for name, device in devices))
        return chip_holder(uuid, held, inventory, "gpu.iluvatar.com", split_only)

    assert holder("GPU-a1", ("iluvatar.com/gpu", "GPU-a0")) == pod  # the board holds both
    assert holder("GPU-a1", ("iluvatar.com/gpu", "GPU-a0"), split_only=True) is None  # on a split node, the chip
    assert holder("GPU-a1", ("iluvatar.com/gpu.shared", "GPU-a1::3"), split_only=True) == pod
    assert holder("GPU-a1", ("iluvatar.com/gpu", "GPU-a0::1")) == pod  # a board's replica holds both chips
    # given under a name no longer served (a rename, renameByDefault turned on): still held
    assert holder("GPU-a0", ("example.com/old-name", "GPU-a0")) == pod
    assert holder("GPU-a1", ("nvidia.com/gpu", "GPU-5d2c1e")) is None  # another vendor's device names none of ours
    assert holder("GPU-a1") is None
    claims = Holdings(claims=(ClaimDevice(pod, "ml", "c", "gpu.iluvatar.com", "node", "board-0"),))
    assert chip_holder("GPU-a1", claims, inventory, "gpu.iluvatar.com") == pod  # a DRA claim on the board
    other = Holdings(claims=(ClaimDevice(pod, "ml", "c", "example.com", "node", "gpu-1"),))
    assert chip_holder("GPU-a1", other, inventory, "gpu.iluvatar.com") is None


def test_a_chip_whose_reset_was_cut_short_is_reset_again_whatever_its_health_reads() -> None:
    """Reserved by a reset that did not finish: it may be half reset, so a clear reading does not return it."""
    cut = Care("GPU-a", 0, phase=WAITING, causes=("MC",), attempts=1, note="its reset was cut short")
    healthy = Diagnosis()
    still = healing.observe(cut, healthy, 10.0, RULES, True, cut_short=True)
    assert (still.phase, still.causes, still.note) == (WAITING, (healing.CUT_SHORT_CAUSE,), cut.note)  # its reset next
    assert healing.observe(cut, healthy, 10.0, RULES, True).phase == HEALTHY  # no longer reserved: back
    fresh = healing.observe(Care("GPU-a", 0), healthy, 10.0, RULES, True, cut_short=True)
    assert (fresh.phase, fresh.causes) == (WAITING, (healing.CUT_SHORT_CAUSE,))
    assert healing.observe(Care("GPU-a", 0), healthy, 10.0, RULES, False, cut_short=True).phase == OFF
    operator = Diagnosis(operator=("XID 64",))
    assert healing.observe(cut, operator, 10.0, RULES, True, cut_short=True).phase == NEEDS_OPERATOR


def test_a_chip_left_to_an_operator_for_a_reason_of_its_own_keeps_it_through_a_passing_operator_error() -> None:
    """A chip that cannot be reset here, or is at its reset limit, gets an OverTemp that cools again: its note still
    says why it waits (and, for the first, still decides that an operator's return runs no ixsmi)."""
    unavailable = healing.unavailable(Care("GPU-a", 0, causes=("XID 48",)), "ixsmi needs CAP_SYS_ADMIN")
    limited = replace(unavailable, note="reset 2 times within 24h: not reset again automatically", limited=True)
    for care in (unavailable, limited):
        hot = healing.observe(care, Diagnosis(resettable=("XID 48",), operator=("OverTemp",)), 1.0, RULES, True)
        assert hot.note == care.note and hot.causes == ("XID 48", "OverTemp")
        cooled = healing.observe(hot, Diagnosis(resettable=("XID 48",)), 2.0, RULES, True)
        assert cooled.phase == NEEDS_OPERATOR and cooled.note == care.note
    assert healing.left_unreset(cooled) is False and healing.left_unreset(unavailable)


@pytest.mark.parametrize(
    ("why", "first"),
    [
        ("the reset limit", Care("GPU-a", 1, phase=NEEDS_OPERATOR, limited=True, resets=(WALL,))),
        ("an XID only an operator clears", Care("GPU-a", 1, phase=NEEDS_OPERATOR, note="needs an operator: XID 64")),
        ("its attempts spent", Care("GPU-a", 1, phase=NEEDS_OPERATOR, attempts=3)),
    ],
)
def test_a_chip_whose_reset_an_operator_asked_for_failed_waits_for_an_operator_again(why: str, first: Care) -> None:
    """Soak seed 508062 (DRA): a chip the reset limit had left to an operator was returned; the reset failed
    (ixsmi failing) and the chip, needing an operator again with its attempts at 1, was reset automatically 28 ms
    later for its Memory bit and XID 46, which a reset clears: two resets for one return."""
    asked = healing.operator_asked(first)
    gone = healing.failed(healing.started(asked, WALL), "ixsmi failed", 2.0, RULES)
    assert gone.phase == NEEDS_OPERATOR and not gone.operator_return, why
    for diagnosis in (Diagnosis(resettable=("Memory", "XID 46")), XID48, Diagnosis(operator=("XID 64",))):
        seen = healing.observe(gone, diagnosis, 3.0, RULES, True, wall_now=WALL + 3)
        assert seen.phase == NEEDS_OPERATOR and not healing.due(seen, 1e9), (why, diagnosis)
    again = healing.operator_asked(gone)  # the operator returns it once more: one more reset
    assert again.phase == WAITING and healing.due(again, 3.0)
    assert healing.observe(gone, Diagnosis(), 4.0, RULES, True).phase == HEALTHY
