"""Processes of the end-to-end cluster: each in its own process group, logging to a file, stopped for sure.

A log's tail (`describe_logs`) goes with every failure, and with every wait that runs out (harness/waits.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LOG_TAIL_LINES = 40


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when there is none)."""
    try:
        with path.open("rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - 64 * 1024))
            text = file.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def describe_logs(logs: Iterable[Path], lines: int = LOG_TAIL_LINES) -> str:
    """Each log's tail under a header naming it."""
    return "".join(f"\n----- {path.name} (last {lines} lines) -----\n{log_tail(path, lines)}" for path in logs)


@dataclass
class Process:
    """A long-running program of the cluster: started in a new session, output appended to log."""

    name: str
    argv: Sequence[str]
    log: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> Process:
        """Start it (its own process group, stdin closed); returns self."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        environment = dict(os.environ if self.env is None else self.env)
        with self.log.open("ab") as output:
            output.write(f"===== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            output.flush()
            self.popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=environment,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was not started"
        return self.popen.pid

    def running(self) -> bool:
        """True while the process has not exited."""
        return self.popen is not None and self.popen.poll() is None

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def check_running(self) -> None:
        """AssertionError with the log tail when the process has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise AssertionError(f"{self.name} exited with code {self.popen.returncode}{describe_logs([self.log])}")

    def signal(self, signum: int) -> None:
        """Send signum to the process (not its group)."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM to the process group, SIGKILL to it after timeout seconds; returns the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with self.log.open("ab") as output:
                    output.write(f"===== not stopped within {timeout} s of SIGTERM: SIGKILL\n".encode())
        # Whatever is left of the group (children that ignored SIGTERM) goes too.
        _signal_group(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL to the whole process group at once (a crash, not a clean stop)."""
        if self.popen is not None:
            _signal_group(self.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log, lines)

    def log_text(self) -> str:
        """The whole log."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def run(
    argv: Sequence[str],
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a short command with a deadline; on failure (check) an AssertionError with its output."""
    try:
        result = subprocess.run(
            list(argv),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else dict(env),
            check=False,
            stdin=None if input_text is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"{' '.join(argv)}: did not finish within {timeout} s") from error
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)}: exit code {result.returncode}\nstdout:\n{result.stdout[-4000:]}\n"
            f"stderr:\n{result.stderr[-4000:]}"
        )
    return result
