"""Resetting chips with CoreX's ixsmi (`ixsmi -r -i <uuid>,...`), as Iluvatar's plugin does.

ixsmi is another program: its output may be any bytes and any length, and it may hang or leave children
behind. It runs in a session of its own; only the last OUTPUT_KEPT bytes of what it prints are kept (read
as it prints, decoded leniently); when it outlasts its deadline, or the plugin is stopping, its whole process
group is killed, and whatever it left running in that group is killed once it has exited.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from ix_device_plugin.hardware.backend import BackendError

log = logging.getLogger(__name__)

OUTPUT_KEPT = 4096  # bytes of ixsmi's output kept, the last ones
MESSAGE_CHARS = 500  # of which at most this many characters go into a message
READ_CHUNK = 65536
POLL = 0.1  # seconds between looks at whether ixsmi exited or the plugin is stopping
DRAIN = 1.0  # seconds to read what is left in the pipe once ixsmi and its group are gone


class _Tail:
    """The last `size` bytes written to it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.data = b""
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.data = (self.data + chunk)[-self.size :]

    def text(self) -> str:
        """What was kept, as text whatever the bytes (one line, at most MESSAGE_CHARS characters)."""
        text = " ".join(self.data.decode("utf-8", errors="replace").split())[-MESSAGE_CHARS:]
        return f"...{text}" if self.total > len(self.data) and text else text


def run_ixsmi_reset(
    ixsmi_path: str, uuids: Sequence[str], timeout: float, abort: threading.Event | None = None
) -> None:
    """Run `ixsmi -r -i <uuids>`; BackendError with ixsmi's words and exit code when it fails, outlasts timeout
    seconds, or abort is set (the plugin is stopping) before it ends."""
    output = run_bounded(
        [ixsmi_path, "-r", "-i", ",".join(uuids)], timeout, abort, "install CoreX's ixsmi or set --ixsmi-path"
    )
    log.info("%s -r -i %s: %s", ixsmi_path, ",".join(uuids), output or "done")


def run_bounded(
    command: Sequence[str], timeout: float, abort: threading.Event | None = None, missing_hint: str = ""
) -> str:
    """Run command (no shell) in a session of its own; what it printed (the end of it) when it exits 0, else
    BackendError with its words and exit code, or saying it outlasted timeout seconds or abort was set (the
    plugin is stopping) and was killed with its whole process group."""
    program, shown = command[0], " ".join(command)
    hint = f": {missing_hint}" if missing_hint else ""
    try:
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise BackendError(f"{program} not found{hint}") from None
    except PermissionError:
        raise BackendError(f"{program} is not executable") from None
    except OSError as error:
        raise BackendError(f"{program} cannot be run: {error.strerror or error}") from None
    tail = _Tail(OUTPUT_KEPT)
    with process, selectors.DefaultSelector() as selector:
        assert process.stdout is not None
        selector.register(process.stdout, selectors.EVENT_READ)
        why = _follow(process, selector, tail, time.monotonic() + timeout, abort)
        _kill_group(process)  # it ended or is overdue: nothing it started may outlive it
        _drain(selector, tail)
        code = process.wait()
    output = tail.text()
    if why == "timeout":
        raise BackendError(f"{shown} did not finish within {timeout:g}s and was killed: {output or 'no output'}")
    if why == "abort":
        raise BackendError(f"{shown} was killed unfinished: the plugin is stopping: {output or 'no output'}")
    if code != 0:
        raise BackendError(f"{shown} exited with code {code}: {output or 'no output'}")
    return output


def _follow(
    process: subprocess.Popen[bytes],
    selector: selectors.BaseSelector,
    tail: _Tail,
    deadline: float,
    abort: threading.Event | None,
) -> str:
    """Keep ixsmi's output until it exits ("exited"), the deadline passes ("timeout") or abort is set ("abort").

    ixsmi is not reaped here, so that its process group cannot be another's when it is killed.
    """
    nap = 0.001
    while True:
        if _exited(process.pid):
            return "exited"
        if abort is not None and abort.is_set():
            return "abort"
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        if not _read(selector, tail, min(POLL, left)):  # the pipe is closed: only the exit is left to wait for
            time.sleep(min(nap, left))
            nap = min(nap * 2, POLL)


def _read(selector: selectors.BaseSelector, tail: _Tail, wait: float) -> bool:
    """Read what the pipe has within wait seconds; False once it is closed by every writer."""
    if not selector.get_map():
        return False
    for key, _ in selector.select(wait):
        chunk = os.read(key.fd, READ_CHUNK)
        if not chunk:
            selector.unregister(key.fileobj)
            return False
        tail.add(chunk)
    return True


def _drain(selector: selectors.BaseSelector, tail: _Tail) -> None:
    """What is left in the pipe, until every writer is gone or DRAIN seconds pass."""
    deadline = time.monotonic() + DRAIN
    while selector.get_map() and time.monotonic() < deadline:
        _read(selector, tail, deadline - time.monotonic())


def _exited(pid: int) -> bool:
    """True when the process has exited (it stays a zombie, unreaped, so its group ID stays its own)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process in ixsmi's process group (ixsmi itself included, if it still runs)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError as error:  # not ours: never expected, but never a reason to fail the reset's report
        log.warning("could not end what %s left running: %s", process.args, error)
