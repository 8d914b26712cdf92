"""The reset helper as its own process, asked over its real socket by the agent's client: it runs exactly
`ixsmi -r -i <uuid>` for a chip of the node, and nothing for anything else."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from helpers.host_tools import cap_sys_admin_missing, require
from helpers.reset_helper_support import COMMAND, START_TIMEOUT, chips, clean_env, running_helper

from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.resetclient import ResetHelperClient, ResetRefused


@pytest.fixture
def can_reset() -> None:
    require(cap_sys_admin_missing())


def test_status_says_ready_and_the_socket_is_private(short_dir: Path, can_reset: None) -> None:
    with running_helper(short_dir) as helper:
        assert helper.client.status() is None
        assert helper.ask(b"status\n") == b"ok ready\n"
        assert stat.S_IMODE(os.stat(helper.socket_path).st_mode) == 0o600


def test_a_known_chip_is_reset_with_exactly_the_fixed_command(short_dir: Path, can_reset: None) -> None:
    chip = chips()[1]
    with running_helper(short_dir) as helper:
        helper.client.reset(chip, timeout=10)
        assert helper.ixsmi.called_with() == [str(helper.ixsmi.path), "-r", "-i", chip]
    assert f"reset of {chip}: ok after" in helper.logged()


def test_an_unknown_chip_is_refused_without_running_ixsmi(short_dir: Path, can_reset: None) -> None:
    with running_helper(short_dir) as helper:
        with pytest.raises(ResetRefused, match=r"unknown chip GPU-0000: this node's chips are GPU-"):
            helper.client.reset("GPU-0000", timeout=10)
        assert not helper.ixsmi.runs()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"reset chip ../../x\n", "'../../x' is not a chip UUID"),
        (b"reset chip a;reboot\n", "is not a chip UUID"),
        (b"reset chips GPU-1\n", "unknown request"),
        (b"reset chip " + b"a" * 300 + b"\n", "over 256 bytes"),
        (b"reset chip GPU-1", "does not end with a newline"),
        (b"status\x00\n", "not printable ASCII"),
    ],
)
def test_a_malformed_request_is_refused_by_name_and_runs_nothing(
    short_dir: Path, can_reset: None, line: bytes, why: str
) -> None:
    with running_helper(short_dir) as helper:
        answer = _ask_closing(helper.socket_path, line)
        assert answer.startswith(b"refused malformed request: ") and why.encode() in answer, answer
        assert not helper.ixsmi.runs()


def test_an_ixsmi_that_fails_is_a_failure_with_its_words(short_dir: Path, can_reset: None) -> None:
    with running_helper(short_dir) as helper:
        helper.ixsmi.code.write_text("1")
        with pytest.raises(BackendError, match=r"failed: .* exited with code 1: ixsmi output: done") as failed:
            helper.client.reset(chips()[0], timeout=10)
        assert not isinstance(failed.value, ResetRefused)


def test_the_rate_limit_refuses_saying_when_to_retry(short_dir: Path, can_reset: None) -> None:
    chip = chips()[0]
    with running_helper(short_dir, IX_RESET_HELPER_MAX_PER_MINUTE="2") as helper:
        helper.client.reset(chip, timeout=10)
        helper.client.reset(chip, timeout=10)
        helper.ixsmi.argv.unlink()
        with pytest.raises(ResetRefused, match=r"rate-limited: 2 resets in the last minute; retry in \d+s"):
            helper.client.reset(chip, timeout=10)
        assert not helper.ixsmi.runs()


def test_a_helper_that_cannot_reset_refuses_with_the_reason_and_runs_nothing(short_dir: Path) -> None:
    sysfs = short_dir / "bare-sys"
    sysfs.mkdir()
    drivers = sysfs / "bus" / "pci" / "drivers"
    with running_helper(short_dir, sysfs_root=sysfs) as helper:
        status = helper.client.status()
        assert status is not None and status.startswith("cannot reset here: ") and f"{drivers} does not exist" in status
        with pytest.raises(ResetRefused, match=r"cannot reset here: .*does not exist"):
            helper.client.reset(chips()[0], timeout=10)
        assert not helper.ixsmi.runs()
    assert helper.logged().count("this helper cannot reset chips") == 1


def test_no_helper_is_a_backend_error_naming_the_socket(short_dir: Path) -> None:
    client = ResetHelperClient(short_dir / "none.sock")
    assert client.status() == (
        f"no reset helper at {short_dir / 'none.sock'}: the reset helper is not running (No such file or directory)"
    )
    with pytest.raises(BackendError, match=r"no reset helper at .*none\.sock: the reset helper is not running"):
        client.reset(chips()[0], timeout=1)


def test_a_stale_socket_is_replaced_and_a_live_one_is_left_alone(short_dir: Path, can_reset: None) -> None:
    with running_helper(short_dir) as first:
        first.process.kill()  # leaves its socket file behind
        first.process.wait(10)
        assert first.socket_path.exists()
    with running_helper(short_dir) as second:
        assert second.client.status() is None
        third = subprocess.run(
            [*COMMAND, "--reset-helper-socket", str(second.socket_path)],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            env=clean_env(IX_BACKEND="simulated"),
        )
        assert third.returncode == 1
        assert f"another reset helper listens on {second.socket_path}" in third.stderr
        assert second.client.status() is None


def _ask_closing(path: Path, line: bytes) -> bytes:
    """Send line, then close the sending side, so that a request without a newline still reaches its end."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10)
        connection.connect(str(path))
        connection.sendall(line)
        connection.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := connection.recv(4096):
            data += chunk
        return data
