"""A SIGTERM while the daemon starts (before its event loop listens) stops it, cleanly, once it listens.

In its pod the agent is the init of a PID namespace, and the kernel drops a signal such a process has no handler
for: a pod deleted while the agent started ran on, registered with the kubelet, and was killed 30 s later with its
socket left behind (the chaos soak, a `helm rollback` right after a `helm upgrade`). Outside a namespace the same
SIGTERM killed the process on the spot (exit -15, no shutdown): here it must end with the daemon's own shutdown.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_a_sigterm_while_the_device_plugin_starts_stops_it_with_its_shutdown(tmp_path: Path) -> None:
    plugins = tmp_path / "device-plugins"
    plugins.mkdir()
    argv = [sys.executable, "-c", SCRIPT, "run", "--backend", "simulated", "--device-plugin-path", str(plugins)]
    argv += ["--kubelet-plugins-directory-path", str(tmp_path / "plugins"), "--cdi-spec-dir", "off"]
    argv += ["--node-feature-dir", "off", "--pod-resources-socket", "off", "--health-address", "127.0.0.1:0"]
    config = tmp_path / "config.yaml"
    config.write_text("flags:\n  splitboard: false\n")
    argv += ["--config", str(config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "SIGTERM received while starting: stopping" in done.stderr, done.stderr[-3000:]
    assert list(plugins.iterdir()) == [], "a socket left behind"
