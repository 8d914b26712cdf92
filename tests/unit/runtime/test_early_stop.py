"""A SIGTERM while the daemon starts (before its event loop listens) stops it, cleanly, once it listens.

In its pod the agent is the init of a PID namespace, and the kernel drops a signal such a process has no handler
for: a pod deleted while the agent started ran on, registered with the kubelet, and was killed 30 s later with its
socket left behind (the chaos soak, a `helm rollback` right after a `helm upgrade`). Outside a namespace the same
SIGTERM killed the process on the spot (exit -15, no shutdown): here it must end with the daemon's own shutdown.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import os, signal, sys
import ix_device_plugin.cli as cli
resolve = cli.resolve
def resolve_then_stopped(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)  # the pod deleted while the agent reads its settings
    return resolve(*args, **kwargs)
cli.resolve = resolve_then_stopped
sys.exit(cli.main(sys.argv[1:]))
"""


# The earliest: as the console script has taken SIGTERM, before the command line's modules are imported.
WHILE_IMPORTING = """
import os, signal, sys
from ix_device_plugin.runtime import earlystop
catch = earlystop.catch
def catch_then_stopped():
    catch()
    os.kill(os.getpid(), signal.SIGTERM)  # the pod deleted while the agent imports its modules
earlystop.catch = catch_then_stopped
from ix_device_plugin import entry
sys.argv = ["ix-device-plugin", *sys.argv[1:]]
sys.exit(entry.main())
"""


def daemon_argv(tmp_path: Path, script: str) -> list[str]:
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    argv = [sys.executable, "-c", script, "run", "--backend", "simulated", "--device-plugin-path", str(plugins)]
    argv += ["--kubelet-plugins-directory-path", str(tmp_path / "plugins"), "--cdi-spec-dir", "off"]
    argv += ["--node-feature-dir", "off", "--pod-resources-socket", "off", "--health-address", "127.0.0.1:0"]
    config = tmp_path / "config.yaml"
    config.write_text("flags:\n  splitboard: false\n")
    return [*argv, "--config", str(config)]


@pytest.mark.parametrize("script", [SCRIPT, WHILE_IMPORTING], ids=["reading its settings", "importing"])
def test_a_sigterm_while_the_device_plugin_starts_stops_it_with_its_shutdown(tmp_path: Path, script: str) -> None:
    done = subprocess.run(daemon_argv(tmp_path, script), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "SIGTERM received while starting: stopping" in done.stderr, done.stderr[-3000:]
    assert list((tmp_path / "device-plugins").iterdir()) == [], "a socket left behind"


def test_a_sigterm_while_a_command_that_is_no_daemon_starts_still_ends_it(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", WHILE_IMPORTING, "list", "--backend", "simulated"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
