"""The soak's simulated hardware (e2e/soak/hardware.py): the simulated backend hands each XID to an agent process
once in its life, so the soak does not count an XID as reported while a process that was sent it still runs (a
rollout replaces the old pod only once the DaemonSet controller gets to it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers.host_tools import cap_sys_admin_missing, require
from tests.helpers.soak_modules import SOAK, load

if str(SOAK.parent) not in sys.path:
    sys.path.insert(0, str(SOAK.parent))  # hardware.py names the chips as the e2e harness does

hardware = load("hardware")

OLD, NEW = 100, 200  # the agent's processes, by host PID


def test_an_xid_the_running_process_was_sent_is_not_reported_again(tmp_path: Path) -> None:
    chips = hardware.Hardware(tmp_path)
    assert chips.raise_xid(0, 64, [OLD])
    assert not chips.raise_xid(0, 64, [OLD])
    assert chips.raise_xid(1, 64, [OLD])


def test_a_new_process_asked_for_while_the_old_one_still_runs_is_sent_it_only_once_the_old_one_is_gone(
    tmp_path: Path,
) -> None:
    chips = hardware.Hardware(tmp_path)
    assert chips.raise_xid(0, 64, [OLD])
    chips.agent_restarted({}, [OLD])  # a rollback asked for: the old pod goes on a while
    assert not chips.raise_xid(0, 64, [OLD])  # the old process, still acting, would ignore it
    assert not chips.raise_xid(0, 64, [OLD, NEW])
    assert chips.raise_xid(0, 64, [NEW])  # the old one gone: the new one was never sent it
    assert not chips.raise_xid(0, 64, [NEW])
    assert "64" in chips.devices.read_text()


def test_an_xid_of_a_chip_still_broken_is_in_the_file_for_the_new_process(tmp_path: Path) -> None:
    chips = hardware.Hardware(tmp_path)
    assert chips.raise_xid(2, 48, [OLD])
    chips.agent_restarted({2: [48]}, [OLD])
    assert "48" in chips.devices.read_text()
    assert not chips.raise_xid(2, 48, [NEW])  # in the file: the new process reports it when it reads the file


def run_ixsmi(chips: object, *prefix: str) -> subprocess.CompletedProcess[str]:
    command = [*prefix, str(chips.ixsmi), "-r", "-i", chips.uuids[0]]  # type: ignore[attr-defined]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def test_the_ixsmi_stand_in_resets_with_privilege_and_logs_start_and_end(tmp_path: Path) -> None:
    require(cap_sys_admin_missing())
    (tmp_path / "drivers").mkdir()
    chips = hardware.Hardware(tmp_path / "node", pci_drivers=str(tmp_path / "drivers"))
    done = run_ixsmi(chips)
    assert done.returncode == 0, done.stderr
    start, end = chips.reset_log.read_text().splitlines()
    assert start.split()[1] == "start" and end.split()[1:4:2] == ["end", "0"] and chips.uuids[0] in end


def test_the_ixsmi_stand_in_refuses_where_the_pci_drivers_folder_is_not_writable_and_logs_the_refusal(
    tmp_path: Path,
) -> None:
    chips = hardware.Hardware(tmp_path / "node", pci_drivers=str(tmp_path / "no-such-folder"))
    done = run_ixsmi(chips)
    assert done.returncode == 1
    assert "ixsmi: Permission denied: resetting a GPU needs privilege" in done.stderr
    assert chips.reset_log.read_text().splitlines()[-1].split()[1:4:2] == ["end", "1"]


def test_the_ixsmi_stand_in_refuses_without_cap_sys_admin(tmp_path: Path) -> None:
    require(cap_sys_admin_missing())
    require(None if shutil.which("setpriv") else "setpriv (util-linux) is not installed: apt-get install util-linux")
    (tmp_path / "drivers").mkdir()
    chips = hardware.Hardware(tmp_path / "node", pci_drivers=str(tmp_path / "drivers"))
    done = run_ixsmi(chips, "setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin", "--")
    assert done.returncode == 1, done.stderr
    assert "needs privilege" in done.stderr
    assert chips.reset_log.read_text().splitlines()[-1].split()[1:4:2] == ["end", "1"]


def test_a_lying_chip_is_listed_under_reset_lie_in_the_devices_file_until_it_is_honest_again(tmp_path: Path) -> None:
    chips = hardware.Hardware(tmp_path)
    chips.set_lying([1, 3], True)
    assert yaml.safe_load(chips.devices.read_text())["reset"] == {"lie": [chips.uuids[1], chips.uuids[3]]}
    chips.set_lying([1, 3], False)
    assert "reset" not in yaml.safe_load(chips.devices.read_text())
