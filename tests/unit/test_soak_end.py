"""The soak comes to its end: a switch of the node that overlaps the last one ends its time away, and what the
faults do later that never ends is reported as the soak's own defect instead of being waited for."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.soak_modules import SoakStandIn, load


def switching(tmp_path: Path) -> SoakStandIn:
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.agent.switched_to = []
    soak.agent.pid = 100
    soak.agent.switch = soak.agent.switched_to.append
    return soak


def test_a_switch_while_away_keeps_the_first_time_away_and_the_switch_back_ends_it(tmp_path: Path) -> None:
    """Seed 577691 (DRA, 30 min): a second switch began 19.7 s after the first, before its switch back; the first
    quiet window stayed open for ever, every operator's return waited for it, and the soak never ended."""
    soak = switching(tmp_path)
    other = load("schedule").other_mode(soak.view.mode)
    for at, to in ((0.0, other), (20.0, other), (40.0, soak.view.mode), (60.0, soak.view.mode)):
        soak.at = at
        soak.faults.switch(to)
    assert soak.agent.switched_to == [other, other, soak.view.mode, soak.view.mode]
    assert soak.timeline.quiet_at(10.0) and soak.timeline.quiet_at(30.0)
    assert not soak.timeline.quiet_at(100.0), soak.timeline.quiet
    assert soak.timeline.away == [(0.0, 40.0)]
    assert any("again while away since 0.0" in note for note in soak.notes)


def soak_on_a_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ticks: list[float]) -> tuple:
    """The runner's Soak composed as the soak composes it, on a clock a sleep moves on, each tick recorded."""
    runner = load("runner")
    soak = SoakStandIn(tmp_path / "hardware", pid=100).soak(tmp_path / "plugins", "device-plugin")
    clock = [0.0]
    soak.timeline.clock = lambda: clock[0]
    monkeypatch.setattr(soak, "observer", SimpleNamespace(tick=lambda: ticks.append(clock[0])))
    monkeypatch.setattr(runner.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    return runner, soak


def test_later_actions_that_never_end_are_reported_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks: list[float] = []
    runner, soak = soak_on_a_clock(tmp_path, monkeypatch, ticks)

    def again() -> None:
        soak.later.after(2.0, again)

    soak.later.after(2.0, again)
    with pytest.raises(runner.SoakOverran, match=r"waited at t\+30[01] s: .*again at t\+30[0-9] s"):
        soak.carry_out([])
    assert len(ticks) == runner.LATER_LIMIT_S + 1


def test_later_actions_that_end_end_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ticks: list[float] = []
    _, soak = soak_on_a_clock(tmp_path, monkeypatch, ticks)
    done: list[float] = []
    soak.later.after(250.0, lambda: done.append(soak.timeline.now()))
    soak.carry_out([])
    assert done == [250.0] and ticks[-1] == 250.0


def test_at_the_end_a_chip_whose_returned_reset_failed_is_returned_again_though_forgotten_since(tmp_path: Path) -> None:
    """Seed 508062 (DRA): the operator returned chip 2 at 1699.4, the reset it asked for failed at 1705.0 (the agent
    rightly left the chip to an operator again), then the node-health record was made unreadable: the chip's window
    reopened after the failed reset, and the end, looking only for failed resets since the window opened, never
    returned it."""
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.windows.add(2, 1683.4, "reset", "XID 48")
    soak.returns.returned[2] = 1699.4
    uuid = soak.hardware.uuids[2]
    soak.hardware.reset_log.write_text(f"1705.0 start 7 -r -i {uuid}\n1705.1 end 7 1 -r -i {uuid}\n")
    soak.at = 1713.0
    soak.windows.forget_xids(1713.0, "the node-health record made unreadable")
    soak.at = 1900.0
    soak.returns.return_open(soak.healing.untrusted)
    assert any(f"iluvatar.com/gpu.return={uuid}" in call for call in soak.admin_calls)


def test_at_the_end_a_chip_the_agent_never_reset_is_not_returned(tmp_path: Path) -> None:
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.windows.add(2, 1683.4, "reset", "XID 48")
    soak.returns.returned[2] = 1699.4
    soak.at = 1900.0
    soak.returns.return_open(soak.healing.untrusted)
    assert soak.admin_calls == []


def lied_resets(soak: SoakStandIn, chip: int, ends: tuple[float, ...]) -> str:
    """A lie on the chip from 1265.0 to 1278.0 and runs of ixsmi for it that exited 0, ending at `ends`."""
    soak.at = 1265.0
    index = soak.healing.lie_begins(chip)
    soak.at = 1278.0
    soak.healing.lie_over(index)
    uuid = soak.hardware.uuids[chip]
    lines = [f"{end - 0.5} start {n} -r -i {uuid}\n{end} end {n} 0 -r -i {uuid}\n" for n, end in enumerate(ends, 7)]
    soak.hardware.reset_log.write_text("".join(lines))
    return uuid


def test_at_the_end_a_chip_whose_resets_lied_is_returned(tmp_path: Path) -> None:
    """Seed 529572 (DRA, 30 min): chip 2's resets lied (ixsmi exited 0, the chip was not reset) at 1266 and by the
    lie's end at 1277; the agent, each unproven, spent its attempts and left the chip to an operator, while the soak
    kept the chip's window healed by a reset; at the end it looked only for resets that failed, and never returned
    it."""
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    soak.windows.add(2, 1265.0, "reset", "XID 48")
    uuid = lied_resets(soak, 2, (1266.0, 1277.5))
    soak.at = 1900.0
    soak.returns.return_open(soak.healing.untrusted)
    assert any(f"iluvatar.com/gpu.return={uuid}" in call for call in soak.admin_calls)


def test_at_the_end_a_chip_whose_reset_was_honest_after_its_lie_is_not_returned(tmp_path: Path) -> None:
    """A reset that ended after the lie (certainly honest) and one the chip broke again after: the agent's new
    episode, nothing spent; the end leaves it to its check."""
    soak = SoakStandIn(tmp_path / "hardware", pid=100)
    lied_resets(soak, 2, (1266.0, 1290.0))
    soak.windows.add(2, 1295.0, "reset", "XID 48")
    soak.at = 1900.0
    soak.returns.return_open(soak.healing.untrusted)
    assert soak.admin_calls == []
