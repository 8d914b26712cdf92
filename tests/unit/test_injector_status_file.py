"""The NRI injector's status file as the agent reads it from the pod's shared folder: real files, under bounds,
whatever another process left there."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core.deviceaccess import InjectorStatus
from ix_device_plugin.deviceaccess.status import MAX_BYTES, read_injector_status

pytestmark = pytest.mark.unit


def test_the_injectors_own_lines_are_read(tmp_path: Path) -> None:
    path = tmp_path / "status"
    path.write_text("unavailable: no NRI socket at /var/run/nri/nri.sock (stat: no such file)\n")
    assert read_injector_status(path) == (
        InjectorStatus(False, "no NRI socket at /var/run/nri/nri.sock (stat: no such file)"),
        "",
    )
    path.write_text("registered\n")
    assert read_injector_status(path) == (InjectorStatus(True), "")


def test_an_absent_file_is_said_absent(tmp_path: Path) -> None:
    assert read_injector_status(tmp_path / "status") == (None, f"{tmp_path / 'status'}: absent")


def test_a_link_a_folder_a_fifo_and_a_huge_file_are_not_read_as_a_status(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("registered\n")
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")  # opened without blocking: no writer needed
    (tmp_path / "huge").write_text("registered\n" + "x" * MAX_BYTES)
    for name in ("link", "folder", "fifo", "huge"):
        status, why = read_injector_status(tmp_path / name)
        assert status is None and why.startswith(str(tmp_path / name)), (name, why)


@given(st.binary(max_size=MAX_BYTES + 8))
def test_any_bytes_are_read_or_refused_with_a_reason(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "status"
        path.write_bytes(content)
        status, why = read_injector_status(path)
    assert (status is None) == bool(why)
