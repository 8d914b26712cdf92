"""Handing the feature file over: retired with NFD's expiry directive at a clean stop, written again by the agent
that follows, never taken from a live agent that wrote it since."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from ix_device_plugin.nodelabels.featurefile import FeatureFileWriter, feature_file_text, is_retired, retired_text

LABELS = {"iluvatar.com/gpu.present": "true", "iluvatar.com/gpu.count": "4"}


def test_a_retired_file_starts_with_nfds_expiry_directive_in_utc_and_keeps_the_labels(tmp_path: Path) -> None:
    writer = FeatureFileWriter(tmp_path)
    writer.apply(LABELS)
    until = datetime(2030, 7, 29, 13, 22, 33, tzinfo=timezone(timedelta(hours=2)))
    assert writer.retire(until)
    text = writer.path.read_text()
    assert text == "# +expiry-time=2030-07-29T11:22:33Z\n" + feature_file_text(LABELS)
    assert is_retired(text) and text == retired_text(feature_file_text(LABELS), until)


def test_the_next_writer_replaces_a_retired_file_even_with_the_same_labels(tmp_path: Path) -> None:
    FeatureFileWriter(tmp_path).apply(LABELS)
    outgoing = FeatureFileWriter(tmp_path)
    outgoing.apply(LABELS)
    assert outgoing.retire(datetime.now(UTC))
    incoming = FeatureFileWriter(tmp_path)
    assert incoming.apply(LABELS)
    assert incoming.path.read_text() == feature_file_text(LABELS)


def test_a_file_another_agent_wrote_since_is_neither_retired_nor_taken_back(tmp_path: Path) -> None:
    outgoing, incoming = FeatureFileWriter(tmp_path), FeatureFileWriter(tmp_path)
    outgoing.apply(LABELS)
    incoming.apply({**LABELS, "iluvatar.com/dra.driver": "gpu.iluvatar.com"})
    theirs = incoming.path.read_text()
    assert not outgoing.retire(datetime.now(UTC))
    assert incoming.path.read_text() == theirs
    assert not outgoing.handed_over()  # a live agent's file: left to it


def test_a_retired_or_removed_file_is_handed_over_to_a_live_writer(tmp_path: Path) -> None:
    live, stopping = FeatureFileWriter(tmp_path), FeatureFileWriter(tmp_path)
    live.apply({**LABELS, "iluvatar.com/dra.driver": "gpu.iluvatar.com"})
    assert not live.handed_over()
    stopping.apply(LABELS)  # wrote last, then stops
    stopping.retire(datetime.now(UTC) + timedelta(minutes=10))
    assert live.handed_over()
    live.path.unlink()
    assert live.handed_over()
    assert not FeatureFileWriter(tmp_path).handed_over()  # one that never wrote has nothing to hand back


def test_no_labels_removes_the_file_and_nothing_is_retired(tmp_path: Path) -> None:
    writer = FeatureFileWriter(tmp_path)
    writer.apply(LABELS)
    writer.apply({})
    assert not writer.path.exists()
    assert not writer.retire(datetime.now(UTC)) and not writer.path.exists()
    assert not writer.handed_over()
