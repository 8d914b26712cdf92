"""Writing a file in place: the inode a bind mount holds is kept; what is not a regular file is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ix_device_plugin.runtime.files import OutputError, keep_aside, kept_aside, overwrite_in_place, remove_oldest_aside


def test_a_file_is_rewritten_in_its_inode_longer_or_shorter(tmp_path: Path) -> None:
    path = tmp_path / "metadata.json"
    overwrite_in_place(path, "first, and long\n")  # not there yet: written atomically
    inode = path.stat().st_ino
    overwrite_in_place(path, "short\n")
    assert path.read_text() == "short\n" and path.stat().st_ino == inode
    overwrite_in_place(path, "longer than before\n")
    assert path.read_text() == "longer than before\n" and path.stat().st_ino == inode


def test_a_symlink_or_a_fifo_is_refused_naming_it(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(OutputError, match=r"cannot write .*link"):
        overwrite_in_place(link, "x")
    assert target.read_text() == "keep\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match=r"cannot write .*fifo"):  # never blocks on a FIFO without a reader
        overwrite_in_place(fifo, "x")


def test_copies_kept_aside_are_named_after_those_there_and_the_oldest_go_first(tmp_path: Path) -> None:
    """A name freed by a removal is not taken again by a newer copy: kept_aside's order stays the order made."""
    path = tmp_path / "record.json"
    made = []
    for version in range(6):
        (tmp_path / "new").write_text(f"version {version}")
        os.replace(tmp_path / "new", path)  # a new inode per version, as an atomic writer leaves it
        made.append(keep_aside(path, "bad"))
        if version == 2:
            assert remove_oldest_aside(path, "bad", 2) == made[:1]
    assert kept_aside(path, "bad") == made[1:]
    assert remove_oldest_aside(path, "bad", 3) == made[1:3]
    assert [p.read_text() for p in kept_aside(path, "bad")] == ["version 3", "version 4", "version 5"]
