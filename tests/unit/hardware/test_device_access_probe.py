"""device_access_problem on this machine's own device cgroup: what it may open is no problem, what is not a
device node is not looked at (tests/system/test_device_access.py has the refusal, in a real container)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from helpers.host_tools import require

from ix_device_plugin.hardware.devnodes import device_access_problem


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    require("needs root to make device nodes (mknod)" if os.geteuid() != 0 else None)
    (tmp_path / "dev").mkdir()
    return tmp_path


def mknod(path: Path, major: int, minor: int) -> None:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))


def test_no_dev_directory_and_no_gpu_nodes_are_no_problem(tmp_path: Path) -> None:
    assert device_access_problem(tmp_path / "nowhere") is None
    (tmp_path / "dev").mkdir()
    assert device_access_problem(tmp_path) is None


def test_plain_files_named_like_gpu_nodes_are_not_opened(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "iluvatar0").write_text("")
    (tmp_path / "dev" / "itrctl").mkdir()  # a test's stand-in, not a device node
    assert device_access_problem(tmp_path) is None


def test_nodes_the_process_may_open_are_no_problem(dev_root: Path) -> None:
    mknod(dev_root / "dev" / "iluvatar0", 1, 3)  # /dev/null's numbers
    mknod(dev_root / "dev" / "itrctl", 1, 3)
    assert device_access_problem(dev_root) is None


def test_a_node_without_a_driver_behind_it_is_not_an_access_problem(dev_root: Path) -> None:
    mknod(dev_root / "dev" / "iluvatar0", 0, 0)  # no driver: ENXIO or ENODEV, IXML's to report
    assert device_access_problem(dev_root) is None
