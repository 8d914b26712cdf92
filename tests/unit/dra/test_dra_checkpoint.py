"""The DRA checkpoint format: round trip, newer versions refused, hostile bytes, old and new fields."""

from __future__ import annotations

import json

import pytest
from helpers.dra_core import REF, allocated_claim, prepared_for

from ix_device_plugin.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointTooNew,
    checkpoint_text,
    parse_checkpoint,
)


def test_the_checkpoint_round_trips_and_refuses_what_it_cannot_read() -> None:
    prepared = prepared_for(allocated_claim("gpu-1"))
    text = checkpoint_text({REF.uid: prepared}, "boot-1")
    assert parse_checkpoint(text, "cp") == Checkpoint("boot-1", {REF.uid: prepared})
    with pytest.raises(CheckpointError, match="cp: is not JSON"):
        parse_checkpoint(text[:20], "cp")
    with pytest.raises(CheckpointError, match="unsupported checkpoint version 0"):
        parse_checkpoint(json.dumps({"version": 0}), "cp")
    broken = json.loads(text)
    del broken["claims"][REF.uid]["devices"][0]["uuid"]
    with pytest.raises(CheckpointError, match=r"cp: claims\.uid-1\.devices\[0\]\.uuid: missing"):
        parse_checkpoint(json.dumps(broken), "cp")


def test_a_checkpoint_of_a_newer_version_is_refused_not_discarded() -> None:
    with pytest.raises(CheckpointTooNew, match="checkpoint version 9 was written by a newer driver"):
        parse_checkpoint(json.dumps({"version": 9, "claims": {}}), "cp")


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'{"version": 1, "claims": {"\xff": {}}}', "is not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested more than"),
        (b'{"version": 1, "claims": ' + b'{"a":' * 40 + b"1" + b"}" * 41, "nested more than 16 levels"),
    ],
)
def test_a_hostile_checkpoint_is_a_clear_error(data: bytes, why: str) -> None:
    with pytest.raises(CheckpointError, match=why):
        parse_checkpoint(data, "cp")


def test_fields_an_older_driver_does_not_know_are_ignored_and_new_ones_default() -> None:
    prepared = prepared_for(allocated_claim("gpu-1"))
    document = json.loads(checkpoint_text({REF.uid: prepared}))
    del document["bootID"]
    del document["claims"][REF.uid]["complete"]
    del document["claims"][REF.uid]["devices"][0]["admin"]
    document["claims"][REF.uid]["future"] = {"x": 1}
    assert parse_checkpoint(json.dumps(document), "cp") == Checkpoint("", {REF.uid: prepared})
