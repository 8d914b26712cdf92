"""Constants and types shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.settings.resolve import resolve
from ix_device_plugin.settings.table import RUN, SETTINGS

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
RESOURCE = "iluvatar.com/gpu"
IXML_DOUBLE_CONFIG = "IXML_DOUBLE_CONFIG"  # the environment variable naming the C double's device file
TWO_CHIPS = (  # the C double's device file: two BI-V100 chips
    'device uuid=GPU-x0 name="Iluvatar BI-V100" minor=0 bus=00000000:8A:00.0\n'
    'device uuid=GPU-x1 name="Iluvatar BI-V100" minor=1 bus=00000000:8B:00.0\n'
)
# Plugins started by tests write no CDI spec or node labels on the machine unless a test asks.
NO_NODE_FILES = ("--cdi-spec-dir", "off", "--node-feature-dir", "off")
DaemonFactory = Callable[..., Awaitable[Daemon]]
# The variables of Iluvatar's plugin 4.4.0 that this one reads too.
UPSTREAM_ENV = frozenset(setting.upstream_env for setting in SETTINGS if setting.upstream_env)


def config_flags(**flags: str | bool) -> dict[str, tuple[Any, str]]:
    """ix-config settings as the daemon holds them when given as flags (`replicas="2"`), for Options.given."""
    text = {name: (str(value).lower() if isinstance(value, bool) else value) for name, value in flags.items()}
    return resolve(RUN, text, {}).given


def spawn_plugin(
    plugin_dir: Path, *args: str, log_file: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `ix-device-plugin run` on simulated GPUs as a process of its own, with no settings from the test's
    environment but those in env."""
    command = [
        sys.executable,
        "-m",
        "ix_device_plugin",
        "run",
        "--backend",
        "simulated",
        "--device-plugin-path",
        str(plugin_dir),
        "--health-address",
        "off",
        "--kubelet-plugins-directory-path",  # the node-health record: never the host's
        str(plugin_dir.parent / "plugins"),
        *NO_NODE_FILES,
        *args,
    ]
    if "--simulated-devices" not in args:
        command += ["--simulated-devices", "BI-V150:2"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("IX_") and k not in UPSTREAM_ENV}
    stderr = log_file.open("wb") if log_file is not None else subprocess.DEVNULL
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env={**clean, **(env or {})})


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Terminate process, killing it when it does not stop within 5 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    """A sample's value in the daemon's metrics registry (0 when it has none yet)."""
    return daemon.metrics.registry.get_sample_value(name, labels) or 0.0


def inject_xid(conf: Path, index: int, xid: int, times: int = 1) -> None:
    """Have the C double whose device file is conf report XID xid on chip index, times times."""
    with conf.open("a") as stream:
        stream.write(f"xid={index},{xid}\n" * times)


def make_dev_root(root: Path, minors: list[int], *, itrctl: bool = True) -> Path:
    """A fake host root whose dev/ holds iluvatar<minor> nodes (and itrctl) as plain files."""
    (root / "dev").mkdir(parents=True)
    for minor in minors:
        (root / "dev" / f"iluvatar{minor}").touch()
    if itrctl:
        (root / "dev" / "itrctl").touch()
    return root
