"""Can this process reset chips: CapEff read from a status text, the driver directory's checks on real directories,
and which directory each backend's reset writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.host_tools import tmpfs

from ix_device_plugin.hardware.resetaccess import (
    CAP_SYS_ADMIN,
    effective_capabilities,
    has_capability,
    local_reset_problem,
    reset_drivers_dir,
)
from ix_device_plugin.settings.options import NodeOptions

PRIVILEGED = "Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\nCapBnd:\t000001ffffffffff\n"
UNPRIVILEGED = "Name:\tpython\nCapEff:\t00000000a80425fb\n"  # a container runtime's default set: no CAP_SYS_ADMIN
ONLY_SYS_ADMIN = f"CapEff:\t{1 << CAP_SYS_ADMIN:016x}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [(PRIVILEGED, 0x1FFFFFFFFFF), (UNPRIVILEGED, 0xA80425FB), ("Name:\tx\n", None), ("CapEff:\tzz\n", None)],
)
def test_the_effective_set_is_read_from_the_status_text(text: str, expected: int | None) -> None:
    assert effective_capabilities(text) == expected


@pytest.mark.parametrize(
    ("text", "held"), [(PRIVILEGED, True), (ONLY_SYS_ADMIN, True), (UNPRIVILEGED, False), ("", False)]
)
def test_cap_sys_admin_is_bit_21(text: str, held: bool) -> None:
    assert has_capability(text, CAP_SYS_ADMIN) is held


def status_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "status"
    path.write_text(text)
    return path


def test_a_privileged_process_with_a_writable_directory_can_reset(tmp_path: Path) -> None:
    assert local_reset_problem(tmp_path, status_file(tmp_path, PRIVILEGED)) is None


def test_each_missing_piece_is_named(tmp_path: Path) -> None:
    status = status_file(tmp_path, UNPRIVILEGED)
    assert local_reset_problem(tmp_path, status) == "this process lacks CAP_SYS_ADMIN"
    absent = tmp_path / "bus" / "pci" / "drivers" / "iluvatar"
    assert local_reset_problem(absent, status) == f"this process lacks CAP_SYS_ADMIN and {absent} does not exist"
    assert local_reset_problem(status, status_file(tmp_path, PRIVILEGED)) == f"{status} is not a directory"
    assert local_reset_problem(tmp_path, tmp_path / "no-status") == "this process lacks CAP_SYS_ADMIN"


def test_a_read_only_mount_is_named(tmp_path: Path) -> None:
    mount = tmp_path / "sys"
    mount.mkdir()
    with tmpfs(mount, "ro,size=1m"):
        problem = local_reset_problem(mount, status_file(tmp_path, UNPRIVILEGED))
    assert problem == f"this process lacks CAP_SYS_ADMIN and {mount} is not writable (read-only mount)"


def test_the_ixml_backend_writes_the_iluvatar_drivers_directory_and_the_simulated_one_the_drivers_directory() -> None:
    ixml = NodeOptions(backend="ixml", sysfs_root=Path("/host/sys"))
    assert reset_drivers_dir(ixml) == Path("/host/sys/bus/pci/drivers/iluvatar")
    simulated = NodeOptions(backend="simulated", sysfs_root=Path("/tmp/sys"))
    assert reset_drivers_dir(simulated) == Path("/tmp/sys/bus/pci/drivers")
