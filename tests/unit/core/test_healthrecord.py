"""The node-health record as data: its text read back whole, fields of a newer agent kept, anything malformed named,
and what a start keeps of it after a restart and after a reboot."""

from __future__ import annotations

import json

import pytest

from ix_device_plugin.core.healing import HEALTHY, NEEDS_OPERATOR, RESETTING, WAITING, Care
from ix_device_plugin.core.healthrecord import (
    CUT_SHORT,
    ChipRecord,
    HealthRecord,
    RecordError,
    chip_record,
    parse_record,
    record_text,
    restore,
)
from ix_device_plugin.settings.health import HealthPolicy

POLICY = HealthPolicy()
A, B = "GPU-a", "GPU-b"


def record(**chips: ChipRecord) -> HealthRecord:
    return HealthRecord(boot_id="boot-1", writer="test", written=100.0, chips={k.replace("_", "-"): v for k, v in
                                                                                chips.items()})  # fmt: skip


def test_the_text_reads_back_as_the_same_record() -> None:
    care = Care(A, 0, phase=WAITING, causes=("XID 48",), attempts=2, note="reset failed", out_since=50.0)
    entry = chip_record(care, frozenset({48}), "reserved for a GPU reset", wall_now=1000.0, mono_now=60.0)
    assert entry.out_since == 990.0 and entry.reserved_since == 1000.0
    written = HealthRecord(boot_id="b", writer="w", written=1000.0, chips={A: entry})
    assert parse_record(record_text(written)) == written
    assert record_text(written) == record_text(parse_record(record_text(written)))  # stable bytes


def test_the_chips_the_return_annotation_named_read_back_and_an_older_record_says_none() -> None:
    written = HealthRecord(boot_id="b", writer="w", written=1000.0, returns_seen=frozenset({"1", A}))
    assert json.loads(record_text(written))["returnsSeen"] == ["1", A]
    assert parse_record(record_text(written)) == written
    assert "returnsSeen" not in record_text(record()) and parse_record(record_text(record())).returns_seen is None


def test_fields_of_a_newer_agent_are_kept_when_written_again() -> None:
    text = record_text(record(GPU_a=ChipRecord(minor=0, xids=frozenset({64}), phase=NEEDS_OPERATOR)))
    document = json.loads(text)
    document["drainPolicy"] = {"mode": "cordon"}
    document["chips"][A]["remapped"] = 3
    again = json.loads(record_text(parse_record(json.dumps(document))))
    assert again["drainPolicy"] == {"mode": "cordon"} and again["chips"][A]["remapped"] == 3


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d.update(version=2), "version 2 was written by a newer agent"),
        (lambda d: d.update(kind="other"), "kind is 'other'"),
        (lambda d: d["chips"][A].update(phase="dancing"), "chips.GPU-a.phase is 'dancing'"),
        (lambda d: d["chips"][A].update(xids=["48"]), "chips.GPU-a.xids is not a list"),
        (lambda d: d["chips"][A].update(attempts=1 << 31), "chips.GPU-a.attempts is 2147483648"),
        (lambda d: d["chips"][A].update(reserved={"reason": ""}), "chips.GPU-a.reserved.reason is empty"),
        (lambda d: d.update(chips=[]), "chips is not an object"),
        (lambda d: d["chips"][A].update(resets="yesterday"), "chips.GPU-a.resets is not a list of at most 64 times"),
        (lambda d: d["chips"][A].update(resets=[1.0] * 65), "chips.GPU-a.resets is not a list of at most 64 times"),
        (lambda d: d["chips"][A].update(resets=[1.0, "now"]), "chips.GPU-a.resets holds 'now', not a time"),
        (lambda d: d["chips"][A].update(resets=[True]), "chips.GPU-a.resets holds True, not a time"),
        (lambda d: d["chips"][A].update(resets=[-5]), "chips.GPU-a.resets holds -5, not a time"),
        (lambda d: d["chips"][A].update(resetLimitReached="yes"), "chips.GPU-a.resetLimitReached is 'yes'"),
        (lambda d: d["chips"][A].update(returnedFor="XID 48"), "chips.GPU-a.returnedFor is not a list"),
        (lambda d: d["chips"][A].update(returnedFor=[48]), "chips.GPU-a.returnedFor"),
        (lambda d: d.update(returnsSeen="1"), "returnsSeen is not a list of at most 1024 chips"),
        (lambda d: d.update(returnsSeen=[1]), "returnsSeen is not a text"),
    ],
)
def test_a_malformed_record_is_refused_naming_what_is_wrong(change, named) -> None:  # type: ignore[no-untyped-def]
    document = json.loads(record_text(record(GPU_a=ChipRecord(minor=0, xids=frozenset({48})))))
    change(document)
    with pytest.raises(RecordError, match=named.replace(".", r"\.").replace("(", r"\(")):
        parse_record(json.dumps(document))
    with pytest.raises(RecordError, match="not JSON"):
        parse_record("{")


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        '{"kind": "ix-device-plugin/node-health", "version": 1, "chips": {}, "x": ' + "[" * 100_000,
        '{"kind": "ix-device-plugin/node-health", "version": 1, "chips": {}, "x": ' + "[" * 40 + "]" * 40 + "}",
    ],
)
def test_a_deeply_nested_record_is_refused_naming_the_nesting(text: str) -> None:
    """Deeper than the JSON parser goes (a RecursionError before), or merely deeper than any record is."""
    with pytest.raises(RecordError, match=r"^the document is nested more than 32 levels deep$"):
        parse_record(text)


def test_a_restart_keeps_everything_and_a_reset_cut_short_is_done_again() -> None:
    kept = record(
        GPU_a=ChipRecord(minor=0, xids=frozenset({64}), phase=NEEDS_OPERATOR, causes=("XID 64",), note="operator"),
        GPU_b=ChipRecord(minor=1, xids=frozenset({48}), phase=RESETTING, attempts=2, reserved="reserved for a reset"),
    )
    restored = restore(kept, "boot-1", POLICY, wall_now=200.0, mono_now=10.0)
    assert restored.xids == {A: frozenset({64}), B: frozenset({48})}
    assert restored.cares[A].phase == NEEDS_OPERATOR and restored.cares[A].note == "operator"
    assert (
        restored.cares[B].phase == WAITING and restored.cares[B].attempts == 2 and restored.cares[B].note == CUT_SHORT
    )
    assert restored.reserved == {B: "reserved for a reset"}  # held out until its reset is done or abandoned


def test_a_reboot_clears_what_a_reset_clears_and_keeps_what_needs_an_operator() -> None:
    before = record(
        GPU_a=ChipRecord(minor=0, xids=frozenset({64}), phase=NEEDS_OPERATOR, causes=("XID 64",)),
        GPU_b=ChipRecord(minor=1, xids=frozenset({48}), phase=NEEDS_OPERATOR, attempts=3, reserved="reserved"),
    )
    restored = restore(before, "boot-2", POLICY, wall_now=200.0, mono_now=10.0)
    assert restored.xids == {A: frozenset({64})}  # XID 64 needs an operator; XID 48 a reset, which the reboot was
    assert set(restored.cares) == {A} and restored.cares[A].phase == NEEDS_OPERATOR
    assert restored.reserved == {}  # a reboot ended every reset
    assert restored.forgotten == (f"{B}: XID 48",)


def test_a_reboot_clears_a_chip_fallen_off_the_bus_unless_the_config_wants_it_looked_at() -> None:
    fell = record(GPU_a=ChipRecord(minor=0, xids=frozenset({79}), phase=NEEDS_OPERATOR, causes=("XID 79",)))
    assert restore(fell, "boot-1", POLICY, wall_now=200.0, mono_now=10.0).xids == {A: frozenset({79})}  # a restart
    assert restore(fell, "boot-2", POLICY, wall_now=200.0, mono_now=10.0).xids == {}  # its remedy is the reboot
    careful = HealthPolicy(operator=frozenset({"XID 79", "XID 48"}))
    assert restore(fell, "boot-2", careful, wall_now=200.0, mono_now=10.0).xids == {A: frozenset({79})}
    ecc = record(GPU_a=ChipRecord(minor=0, xids=frozenset({48}), phase=NEEDS_OPERATOR, causes=("XID 48",)))
    assert restore(ecc, "boot-2", careful, wall_now=200.0, mono_now=10.0).xids == {A: frozenset({48})}


def test_a_record_with_the_negative_attempts_the_release_before_wrote_keeps_its_chips() -> None:
    """The release before wrote attempts -1 after a reset refused before it started (a full disk): that record is
    read, the count as 0, and the chip that needs an operator stays known (refusing the record would forget it)."""
    times = {"wall_now": 1000.0, "mono_now": 60.0}
    entry = chip_record(
        Care(A, 0, phase=NEEDS_OPERATOR, attempts=3, note="needs an operator"), frozenset({64}), "", **times
    )
    waiting = chip_record(Care(B, 1, phase=WAITING, note="reset refused"), frozenset({48}), "", **times)
    data = json.loads(record_text(HealthRecord(boot_id="b", writer="w", written=1000.0, chips={A: entry, B: waiting})))
    data["chips"][B]["attempts"] = -1
    read = parse_record(json.dumps(data))
    assert read.chips[A].phase == NEEDS_OPERATOR and read.chips[B].attempts == 0 and read.chips[B].xids == {48}


def test_a_chips_reset_history_reads_back_pruned_to_the_window_and_is_kept_while_it_is_healthy() -> None:
    care = Care(A, 0, phase=NEEDS_OPERATOR, note="reset 2 times within 24h", resets=(100.0, 90_000.0, 95_000.0),
                limited=True)  # fmt: skip
    entry = chip_record(care, frozenset(), "", wall_now=100_000.0, mono_now=5.0, window=86_400.0)
    assert entry.resets == (90_000.0, 95_000.0) and entry.reset_limited  # the first is older than the window
    written = HealthRecord(boot_id="b", writer="w", written=100_000.0, chips={A: entry})
    document = json.loads(record_text(written))
    assert document["chips"][A]["resets"] == [90_000.0, 95_000.0] and document["chips"][A]["resetLimitReached"]
    assert parse_record(record_text(written)) == written
    healthy = chip_record(Care(B, 1, resets=(95_000.0,)), frozenset(), "", wall_now=100_000.0, mono_now=5.0)
    assert healthy.worth_keeping  # a healthy chip with a history is kept
    assert not chip_record(Care(B, 1), frozenset(), "", wall_now=1.0, mono_now=1.0).worth_keeping
    plain = json.loads(record_text(record(GPU_b=ChipRecord(minor=1, xids=frozenset({64})))))["chips"][B]
    assert "resets" not in plain and "resetLimitReached" not in plain  # said only when they say something
    assert parse_record(json.dumps({"kind": "ix-device-plugin/node-health", "version": 1, "chips": {
        B: {"resets": [3.0, 1.0]}}})).chips[B].resets == (1.0, 3.0)  # fmt: skip


def test_a_restart_and_a_reboot_keep_the_reset_history_and_a_restart_keeps_the_limit_reached() -> None:
    kept = record(
        GPU_a=ChipRecord(minor=0, xids=frozenset({48}), phase=NEEDS_OPERATOR, causes=("XID 48",),
                         note="reset 2 times within 24h", resets=(10.0, 20.0), reset_limited=True),
        GPU_b=ChipRecord(minor=1, resets=(30.0,)),
    )  # fmt: skip
    restarted = restore(kept, "boot-1", POLICY, wall_now=200.0, mono_now=10.0)
    assert restarted.cares[A].limited and restarted.cares[A].resets == (10.0, 20.0)
    assert restarted.cares[B] == Care(B, 1, resets=(30.0,))  # healthy, with its history
    rebooted = restore(kept, "boot-2", POLICY, wall_now=200.0, mono_now=10.0)
    assert rebooted.xids == {}  # the reboot reset the chips: XID 48 forgotten, and the limit's hold with it
    assert rebooted.cares == {A: Care(A, 0, resets=(10.0, 20.0)), B: Care(B, 1, resets=(30.0,))}
    assert rebooted.cares[A].phase == HEALTHY


def test_what_an_operators_return_covered_is_kept_across_a_restart_while_the_return_is_pending() -> None:
    asked = Care(A, 0, phase=WAITING, causes=("XID 48",), operator_return=True, returned_for=("XID 48",))
    entry = chip_record(asked, frozenset({48, 64}), "", wall_now=100.0, mono_now=5.0)
    document = json.loads(record_text(record(GPU_a=entry)))
    assert document["chips"][A]["returnedFor"] == ["XID 48"]
    restarted = restore(parse_record(record_text(record(GPU_a=entry))), "boot-1", POLICY, wall_now=200.0, mono_now=1.0)
    assert restarted.cares[A].operator_return and restarted.cares[A].returned_for == ("XID 48",)
    done = chip_record(Care(A, 0, phase=NEEDS_OPERATOR, returned_for=("XID 48",)), frozenset({64}), "", wall_now=1.0,
                       mono_now=1.0)  # fmt: skip
    assert "returnedFor" not in json.loads(record_text(record(GPU_a=done)))["chips"][A]  # only while pending
