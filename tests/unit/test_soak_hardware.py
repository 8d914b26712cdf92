"""The soak's simulated hardware (e2e/soak/hardware.py): the simulated backend hands each XID to an agent process
once in its life, so the soak does not count an XID as reported while a process that was sent it still runs (a
rollout replaces the old pod only once the DaemonSet controller gets to it)."""

from __future__ import annotations

import sys
from pathlib import Path

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
