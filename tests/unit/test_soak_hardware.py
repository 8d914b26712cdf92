"""The soak's simulated hardware (e2e/soak/hardware.py): the simulated backend hands each XID to an agent process
once in its life, so the soak does not count an XID as reported while a process that was sent it still runs (a
rollout replaces the old pod only once the DaemonSet controller gets to it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from ix_device_plugin.hardware import simulated
from ix_device_plugin.hardware.backend import XidEvent
from tests.helpers.host_tools import cap_sys_admin_missing, require
from tests.helpers.soak_modules import SOAK, SoakStandIn, load

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


def xids_sent_to_a_process_listening_now(chips: object, dev_root: Path) -> list[tuple[int, int]]:
    """What the agent's simulated backend, started on the soak's devices file and listening for XIDs now, is sent."""
    backend = simulated.SimulatedBackend(str(chips.devices), dev_root=dev_root)  # type: ignore[attr-defined]
    sent: list[XidEvent] = []
    backend.watch_xids(sent.append)
    backend.discover()
    return [(chips.uuids.index(event.uuid), event.xid) for event in sent]  # type: ignore[attr-defined]


def test_a_reset_that_healed_a_chip_takes_its_xids_out_of_the_file_kept_for_a_process_on_standby(
    tmp_path: Path,
) -> None:
    """Seed 464865 (device plugin, 30 min): chip 1 with XIDs 48 and 64 when a rollout was asked for, so the file kept
    them for the new pod; the old pod reset the chip 9 s later and the new one, on standby, took over 5 s after that:
    sent XIDs 48 and 64 as it began listening, it rightly left the chip to an operator, which "back in service" called
    a chip not back. A healed chip no longer reports them; the process that was sent them does not report them again."""
    chips = hardware.Hardware(tmp_path / "hardware")
    assert chips.raise_xid(1, 48, [OLD]) and chips.raise_xid(1, 64, [OLD]) and chips.raise_xid(3, 61, [OLD])
    chips.agent_restarted({1: [48, 64], 3: [61]}, [OLD])  # the rollout: the new pod starts on standby
    assert xids_sent_to_a_process_listening_now(chips, tmp_path) == [(1, 48), (1, 64), (3, 61)]
    assert chips.reset_healed(1, []) == [48, 64]  # the old pod's reset of chip 1, seen by the soak
    assert xids_sent_to_a_process_listening_now(chips, tmp_path) == [(3, 61)]  # the new pod takes over now
    assert not chips.raise_xid(1, 48, [OLD, NEW])  # the old process would still ignore it
    assert chips.reset_healed(3, [61]) == []  # XID 61 reported again after the reset ended: it stays
    assert chips.reset_healed(1, []) == []


def rollout_then_reset(tmp_path: Path, rollout_done: float | None) -> SoakStandIn:
    """Seed 464865's chip 1: XID 48, then XID 64 (returned, so it waits for a reset), a rollout asked for at 428.0,
    the old pod's reset ending at 437.5, seen by the soak at 438.3."""
    checker = load("checker")
    soak = SoakStandIn(tmp_path / "hardware", pid=OLD)
    soak.at = 360.9
    soak.faults.xid(1, 48, "xid-reset")
    soak.at = 385.3
    soak.faults.xid(1, 64, "xid-operator")
    soak.windows.awaits_reset(1, 400.9)
    soak.timeline.rollouts.append(checker.Rollout(428.0, 8, "rollout to revision 13", rollout_done))
    soak.hardware.agent_restarted(soak.windows.still_broken_xids(), soak.agent.pids)  # as new_agent_process
    soak.at = 438.3
    soak.healing.reset_seen(checker.Reset(437.3, 437.5, frozenset({1}), ok=True))
    return soak


def test_a_reset_seen_after_a_pod_on_standby_may_have_begun_listening_leaves_its_xids_in_doubt(tmp_path: Path) -> None:
    """The rollout not done when the reset ended: the new pod may have taken over in the 0.8 s before the soak saw
    the reset, and been sent both XIDs; the chip is not expected back until seen in service, or healed."""
    checker = load("checker")
    soak = rollout_then_reset(tmp_path, rollout_done=None)
    assert xids_sent_to_a_process_listening_now(soak.hardware, tmp_path) == []
    assert not checker.healthy_since(1, 467.6, soak.timeline.broken, [])  # the first violation's time: not judged now
    assert not soak.windows.certainly_broken(1) and any("maybe sent again" in note for note in soak.notes)
    soak.windows.seen_back(447.6, lambda chip: True)  # the new pod did not get them: the chip in service
    assert checker.healthy_since(1, 447.6 + checker.BOUND_S, soak.timeline.broken, [])


def test_a_reset_after_the_rollout_was_done_heals_its_chip_for_certain(tmp_path: Path) -> None:
    checker = load("checker")
    soak = rollout_then_reset(tmp_path, rollout_done=436.0)
    assert xids_sent_to_a_process_listening_now(soak.hardware, tmp_path) == []
    assert soak.windows.open == [] and soak.notes == []
    assert checker.healthy_since(1, 467.6, soak.timeline.broken, [])


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


def test_the_operator_returns_a_chip_only_once_the_agent_can_see_the_node_again(tmp_path: Path) -> None:
    """Seed 845231: chip 3 left to an operator at its reset limit (1484.9); the soak's operator removed and set the
    annotation naming it again at 1509.5, 0.8 s after the API server was back from a restart (1501.6 - 1508.7),
    before the agent saw the Node again: the agent never saw the removal, so it never heard the return, and the chip
    stayed out to the end. The operator now asks once the quiet window is over."""
    soak = SoakStandIn(tmp_path / "hardware", pid=OLD)
    returns = load("returns")
    calls = soak.admin_calls
    soak.timeline.quiet = [(1501.6, 1518.7)]
    soak.at = 1509.5
    soak.returns.operator_returns(3)
    soak.returns.operator_returns(3)  # asked again meanwhile: one return waits
    assert calls == [] and 3 not in soak.returns.returned and len(soak.later.due) == 1
    soak.at = 1511.5
    soak.later.run_due(soak.at)
    assert calls == [] and len(soak.later.due) == 1  # still quiet: later again
    soak.at = 1519.5
    soak.later.run_due(soak.at)
    uuid = soak.hardware.uuids[3]
    assert calls == [
        ("annotate", "node", "node", f"{returns.RETURN_ANNOTATION}-"),
        ("annotate", "node", "node", f"{returns.RETURN_ANNOTATION}={uuid}", "--overwrite"),
    ]
    assert soak.returns.returned == {3: 1519.5} and soak.notes[-1] == "operator returned chip 3"


def test_a_chip_back_on_the_bus_is_healed_of_its_absence_before_a_return_that_waits_out_a_quiet_window(
    tmp_path: Path,
) -> None:
    """Seed 577175's chip 2: off the bus at 200.6, back at 212.5 during a config change's quiet window; the agent put
    it back in service at once ("not present" keeps a chip out only while it stands) and gave it at 215.9, before
    the operator's return, deferred by the window, landed at 227.0."""
    checker, faults = load("checker"), load("faults")
    soak = SoakStandIn(tmp_path / "hardware", pid=OLD)
    soak.at = 200.6
    soak.hardware.set_present(2, False)
    soak.healing.broken(2, "return", faults.OFF_BUS)
    soak.timeline.quiet.append((209.3, 218.6))
    soak.at = 212.5
    soak.faults.back_on_bus(2)
    assert soak.admin_calls == [] and len(soak.later.due) == 1  # the return waits for the window's end
    invariant = checker.Invariant("broken not given")
    allocation = checker.NewAllocation("soak-25", frozenset({2}), 214.5, 215.9)
    checker.broken_not_given(invariant, [allocation], soak.timeline.broken)
    assert invariant.checks == 1 and invariant.violations == []
    assert [(w.until, w.why) for w in soak.timeline.broken] == [(212.5, f"{faults.OFF_BUS}, back on the bus")]


def test_a_limit_reached_while_the_agent_restarts_is_judged_once_its_new_process_could_say_it(tmp_path: Path) -> None:
    """Seed 176345 (DRA): chip 1 left to an operator by the reset limit at 151.1, as the API server restarted; the agent
    was killed 0.3 s after the server was back, its Event unsent. The new process (Ready at 167.8) says again what
    waits for an operator; the soak looks for the Event only SAY_AGAIN_S after the quiet window."""
    returns = load("returns")
    soak = SoakStandIn(tmp_path / "hardware", pid=OLD)
    said: list[float] = []
    soak.returns.limit_said = lambda uuid, since: said.append(soak.at) or True  # the Event, as the API has it
    soak.at = 151.1
    soak.returns.counts.chips[1].limited = 151.1
    soak.healing.broken(1, "return", "health Memory")
    soak.timeline.quiet.append((151.0, 167.8))
    soak.at = 167.9
    soak.returns.limit_return(1)
    assert said == [] and soak.admin_calls == []
    soak.at = 167.9 + returns.SAY_AGAIN_S + returns.RETURN_RETRY_S
    soak.later.run_due(soak.at)
    assert said == [soak.at] and soak.notes[-1] == "operator returned chip 1"
