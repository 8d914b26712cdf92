"""The reset helper as its own process on simulated chips, with an ixsmi stand-in the test holds the strings of."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from helpers.support import UPSTREAM_ENV
from helpers.waits import until_sync
from ix_device_plugin.hardware.resetclient import ResetHelperClient
from ix_device_plugin.hardware.simulated import SimulatedBackend

DEVICES = "BI-V150:1"  # two chips
START_TIMEOUT = 20.0


def chips() -> list[str]:
    """The UUIDs of DEVICES' chips, as the helper's simulated backend finds them."""
    return sorted(chip.uuid for chip in SimulatedBackend(DEVICES).discover().chips())


class IxsmiStandIn:
    """An executable standing in for ixsmi: writes each argument on a line of `argv`, its PID to `pid`, then
    waits (in a loop of `sleep`, so that its process group holds a child too) until `release` exists when `hold`
    exists, and exits with the code in `code`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.argv, self.pid, self.hold, self.release, self.code = (
            directory / name for name in ("argv", "pid", "hold", "release", "code")
        )
        self.code.write_text("0")
        self.path = directory / "ixsmi"
        self.path.write_text(
            "#!/bin/sh\n"
            f'echo "$0" > {self.argv}; for a in "$@"; do echo "$a" >> {self.argv}; done\n'
            f"echo $$ > {self.pid}.tmp && mv {self.pid}.tmp {self.pid}\n"
            f"while [ -e {self.hold} ] && [ ! -e {self.release} ]; do sleep 0.05; done\n"
            f'echo "ixsmi output: done"; exit $(cat {self.code})\n'
        )
        self.path.chmod(self.path.stat().st_mode | stat.S_IEXEC)

    def runs(self) -> bool:
        return self.argv.exists()

    def called_with(self) -> list[str]:
        return self.argv.read_text().splitlines()

    def group(self) -> int:
        """The process group of the running stand-in (its PID: ixsmi runs in a session of its own)."""
        return int(until_sync(lambda: self.pid.exists() and self.pid.read_text().strip(), message="ixsmi started"))


def live_in_group(group: int) -> list[int]:
    """The processes of a process group that are not zombies (a killed child may wait to be reaped by init)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


@dataclass
class Helper:
    """A running `ix-device-plugin reset-helper` and what a test looks at."""

    process: subprocess.Popen[bytes]
    socket_path: Path
    log: Path
    ixsmi: IxsmiStandIn

    @property
    def client(self) -> ResetHelperClient:
        return ResetHelperClient(self.socket_path)

    def ask(self, line: bytes) -> bytes:
        """Send raw bytes as a request and return the raw answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(10)
            connection.connect(str(self.socket_path))
            connection.sendall(line)
            data = b""
            while not data.endswith(b"\n") and (chunk := connection.recv(4096)):
                data += chunk
            return data

    def logged(self) -> str:
        return self.log.read_text(errors="replace")


COMMAND = [sys.executable, "-m", "ix_device_plugin", "reset-helper"]


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without any of the agent's settings, with settings laid over it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("IX_") and k not in UPSTREAM_ENV}
    return {**clean, **settings}


def spawn_helper(root: Path, sysfs_root: Path | None = None, **env: str) -> Helper:
    """Start the helper with the simulated backend, its socket, sysfs root and ixsmi stand-in under root."""
    if sysfs_root is None:
        sysfs_root = root / "sys"
        (sysfs_root / "bus" / "pci" / "drivers").mkdir(parents=True, exist_ok=True)
    ixsmi = IxsmiStandIn(root / "ixsmi")
    socket_path = root / "run" / "reset.sock"
    log = root / "helper.log"
    settings = {
        "IX_BACKEND": "simulated",
        "IX_SIMULATED_DEVICES": DEVICES,
        "IX_SYSFS_ROOT": str(sysfs_root),
        "IX_IXSMI_PATH": str(ixsmi.path),
        "IX_RESET_HELPER_SOCKET": str(socket_path),
        "IX_RESET_TIMEOUT": "30",
    }
    with log.open("wb") as stderr:
        process = subprocess.Popen(COMMAND, stdout=subprocess.DEVNULL, stderr=stderr, env=clean_env(**settings, **env))
    helper = Helper(process, socket_path, log, ixsmi)

    def started() -> bool:
        return process.poll() is not None or not (helper.client.status() or "").startswith("no reset helper")

    until_sync(started, timeout=START_TIMEOUT, message=f"the helper listening (log: {log})")
    if process.poll() is not None:
        raise AssertionError(f"the helper exited with code {process.returncode}: {helper.logged()}")
    return helper


@contextmanager
def running_helper(root: Path, sysfs_root: Path | None = None, **env: str) -> Iterator[Helper]:
    """spawn_helper, stopped (and killed if it does not stop) afterwards."""
    helper = spawn_helper(root, sysfs_root, **env)
    try:
        yield helper
    finally:
        if helper.process.poll() is None:
            helper.process.send_signal(signal.SIGTERM)
            try:
                helper.process.wait(20)
            except subprocess.TimeoutExpired:
                helper.process.kill()
                helper.process.wait(5)
