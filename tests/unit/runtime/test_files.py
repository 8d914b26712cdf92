"""Writing a file in place: the inode a bind mount holds is kept; what is not a regular file is refused."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


_OURS = re.compile(r"record\.json\.bad-[0-9]+(-[0-9]+)?")
_NAMES = st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=60)


@given(others=st.lists(_NAMES.filter(lambda name: name not in (".", "..") and not _OURS.fullmatch(name)), max_size=12,
                       unique=True),
       copies=st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 200)), max_size=12, unique=True),
       kept=st.integers(0, 6))  # fmt: skip
def test_only_the_oldest_copies_go_whatever_else_is_named_beside(
    others: list[str], copies: list[tuple[int, int]], kept: int
) -> None:
    """Names another process chose beside the file are never removed, whatever they are; of the copies, the kept
    newest stay (by their time, then their number)."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "record.json"
        for name in others:
            with contextlib.suppress(OSError):  # a name too long for the file system
                (Path(directory) / name).write_text("theirs")
        names = [f"record.json.bad-{stamp}" + (f"-{number}" if number else "") for stamp, number in copies]
        for name in set(names):
            (Path(directory) / name).write_text("ours")
        before = set(os.listdir(directory))
        removed = {entry.name for entry in remove_oldest_aside(path, "bad", kept)}
        ours = sorted(set(copies))
        newest = {f"record.json.bad-{s}" + (f"-{n}" if n else "") for s, n in ours[max(0, len(ours) - kept) :]}
        assert removed <= set(names) and set(os.listdir(directory)) == before - removed
        assert {p.name for p in kept_aside(path, "bad")} == newest
