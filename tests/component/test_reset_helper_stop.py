"""The reset helper while a reset runs: a second request is refused busy, a client that goes away gets ixsmi's whole
process group killed, and SIGTERM lets ixsmi end for STOP_GRACE, then kills it and exits 0 within the bound."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.host_tools import cap_sys_admin_missing, require
from helpers.reset_helper_support import Helper, chips, live_in_group, running_helper
from helpers.waits import until_sync

from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.resetclient import ResetRefused
from ix_device_plugin.resethelper.server import KILL_GRACE, STOP_GRACE

ENDS = 10.0  # how long a test waits for something bounded to happen


@pytest.fixture(autouse=True)
def can_reset() -> None:
    require(cap_sys_admin_missing())


def in_background(work: Callable[[], None]) -> tuple[threading.Thread, list[BaseException | None]]:
    """work() on a thread; the list gets its exception (None when it returned)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:
            outcome.append(error)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def held_reset(helper: Helper, chip: str, abort: threading.Event | None = None) -> tuple[threading.Thread, list]:
    """A reset of chip whose ixsmi stays running until released; returns once ixsmi runs."""
    helper.ixsmi.hold.touch()
    started = in_background(lambda: helper.client.reset(chip, timeout=30, abort=abort))
    helper.ixsmi.group()
    return started


def test_a_second_request_while_one_runs_is_refused_busy(short_dir: Path) -> None:
    first, second = chips()
    with running_helper(short_dir) as helper:
        thread, outcome = held_reset(helper, first)
        with pytest.raises(ResetRefused, match=f"busy: resetting {first}"):
            helper.client.reset(second, timeout=10)
        assert helper.ask(b"status\n") == f"ok ready; resetting {first}\n".encode()
        helper.ixsmi.release.touch()
        thread.join(ENDS)
        assert outcome == [None]
        assert helper.ixsmi.called_with()[1:] == ["-r", "-i", first]


def test_a_client_that_aborts_gets_ixsmis_process_group_killed(short_dir: Path) -> None:
    abort = threading.Event()
    with running_helper(short_dir) as helper:
        thread, outcome = held_reset(helper, chips()[0], abort)
        group = helper.ixsmi.group()
        assert live_in_group(group)
        abort.set()
        thread.join(ENDS)
        assert len(outcome) == 1 and isinstance(outcome[0], BackendError)
        assert "abandoned unfinished" in str(outcome[0])
        until_sync(lambda: not live_in_group(group), timeout=ENDS, message="ixsmi's process group gone")
        until_sync(lambda: helper.ask(b"status\n") == b"ok ready\n", timeout=ENDS, message="the helper free again")
        assert not helper.ixsmi.release.exists()
    assert "went away: killing ixsmi" in helper.logged()


def test_a_connection_closed_mid_reset_gets_ixsmi_killed(short_dir: Path) -> None:
    with running_helper(short_dir) as helper:
        helper.ixsmi.hold.touch()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(helper.socket_path))
            connection.sendall(f"reset chip {chips()[0]}\n".encode())
            group = helper.ixsmi.group()
        until_sync(lambda: not live_in_group(group), timeout=ENDS, message="ixsmi's process group gone")
        until_sync(lambda: helper.ask(b"status\n") == b"ok ready\n", timeout=ENDS, message="the helper free again")


def test_sigterm_during_a_reset_kills_ixsmi_after_the_grace_and_exits_0(short_dir: Path) -> None:
    with running_helper(short_dir) as helper:
        thread, outcome = held_reset(helper, chips()[0])
        group = helper.ixsmi.group()
        asked = time.monotonic()
        helper.process.send_signal(signal.SIGTERM)
        code = helper.process.wait(STOP_GRACE + KILL_GRACE + ENDS)
        took = time.monotonic() - asked
        thread.join(ENDS)
        assert code == 0
        assert STOP_GRACE - 1 <= took <= STOP_GRACE + KILL_GRACE + 2, took
        assert not live_in_group(group)
        assert len(outcome) == 1 and "was killed unfinished" in str(outcome[0])
        assert not helper.socket_path.exists()
    assert "Traceback" not in helper.logged()


def test_sigterm_lets_a_reset_that_ends_in_time_finish(short_dir: Path) -> None:
    with running_helper(short_dir) as helper:
        thread, outcome = held_reset(helper, chips()[0])
        helper.process.send_signal(signal.SIGTERM)
        until_sync(lambda: "stopping: the reset of" in helper.logged(), timeout=ENDS, message="the helper stopping")
        helper.ixsmi.release.touch()
        assert helper.process.wait(ENDS) == 0
        thread.join(ENDS)
        assert outcome == [None]
    assert "Traceback" not in helper.logged()


def test_sigterm_when_idle_exits_0_at_once(short_dir: Path) -> None:
    with running_helper(short_dir) as helper:
        asked = time.monotonic()
        helper.process.send_signal(signal.SIGTERM)
        assert helper.process.wait(ENDS) == 0
        assert time.monotonic() - asked < 3
        assert not helper.socket_path.exists()
    assert "Traceback" not in helper.logged()
