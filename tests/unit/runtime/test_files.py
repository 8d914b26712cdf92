"""Writing a file in place: the inode a bind mount holds is kept; what is not a regular file is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ix_device_plugin.runtime.files import OutputError, overwrite_in_place


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
