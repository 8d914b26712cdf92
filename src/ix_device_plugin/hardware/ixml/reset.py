"""Resetting chips with CoreX's ixsmi (`ixsmi -r -i <uuid>,...`), as Iluvatar's plugin does."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Sequence

from ix_device_plugin.hardware.backend import BackendError

log = logging.getLogger(__name__)


def run_ixsmi_reset(ixsmi_path: str, uuids: Sequence[str], timeout: float) -> None:
    """Run `ixsmi -r -i <uuids>`; BackendError with ixsmi's words when it fails or outlasts timeout seconds."""
    command = [ixsmi_path, "-r", "-i", ",".join(uuids)]
    shown = " ".join(command)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise BackendError(f"{ixsmi_path} not found: install CoreX's ixsmi or set --ixsmi-path") from None
    except PermissionError:
        raise BackendError(f"{ixsmi_path} is not executable") from None
    except subprocess.TimeoutExpired:
        raise BackendError(f"{shown} did not finish within {timeout:g}s") from None
    output = " ".join((done.stdout + done.stderr).split())[-500:]
    if done.returncode != 0:
        raise BackendError(f"{shown} exited with code {done.returncode}: {output or 'no output'}")
    log.info("%s: %s", shown, output or "done")
