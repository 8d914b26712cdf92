"""Whatever sits at the agent's output paths cannot hang it, bloat it or keep it from stopping."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from helpers.support import spawn_plugin, stop_process
from helpers.waits import until_sync

SPEC = "iluvatar.com-gpu.yaml"


def wait_for_spec(path: Path, timeout: float = 20.0) -> dict:
    until_sync(lambda: path.is_file() and not path.is_symlink(), timeout, 0.05, f"{path} written as a file")
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-dev-zero"])
def test_a_fifo_or_an_endless_file_at_the_cdi_spec_path_is_replaced(short_dir: Path, kind: str) -> None:
    plugin_dir, cdi = short_dir / "device-plugins", short_dir / "cdi"
    plugin_dir.mkdir()
    cdi.mkdir()
    spec = cdi / SPEC
    if kind == "fifo":
        os.mkfifo(spec)
    else:
        spec.symlink_to("/dev/zero")
    stale = cdi / f".{SPEC}.abc123.tmp"  # left by a kill -9 in the middle of a write
    stale.write_text("half a spec")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    process = spawn_plugin(plugin_dir, "--cdi-spec-dir", str(cdi))
    try:
        document = wait_for_spec(spec)
        assert document["kind"] == "iluvatar.com/gpu" and len(document["devices"]) == 5  # 4 chips and `all`
        assert not stale.exists()
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
        assert time.monotonic() - started < 2.5
    finally:
        stop_process(process)
