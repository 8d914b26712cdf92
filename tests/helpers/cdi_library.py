"""The real CDI library (tags.cncf.io/container-device-interface, as containerd uses it), through the end-to-end
build's `cdi-validate --inject`: what a container given some CDI devices, in some order, gets."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from helpers.host_tools import e2e_tool


def cdi_validate() -> tuple[Path | None, str]:
    """The cdi-validate binary that knows --inject, or None and why not ($IX_CDI_VALIDATE names another)."""
    binary = e2e_tool("cdi-validate", "IX_CDI_VALIDATE")
    if not binary.is_file():
        return None, f"{binary} is not built: run `make e2e-build` (or e2e/cluster/build.sh)"
    with tempfile.TemporaryDirectory() as empty:
        probe = subprocess.run(
            [str(binary), "--inject", "vendor.example/probe=x", empty], capture_output=True, text=True, timeout=30
        )
    if "unresolvable" not in probe.stderr:
        return None, f"{binary} predates --inject: build the tools again (e2e/cluster/build.sh rebuilds them)"
    return binary, ""


def inject(binary: Path, spec_dir: Path, devices: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The env (as a dict: a name set twice keeps its place and its last value) and device paths that the CDI
    library gives a container of these devices, injected in this order."""
    done = subprocess.run(
        [str(binary), "--inject", ",".join(devices), str(spec_dir)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, f"cdi-validate --inject {','.join(devices)}: {done.stderr}"
    result = json.loads(done.stdout)
    names = [item.partition("=")[0] for item in result["env"]]
    assert len(names) == len(set(names)), f"the CDI library left a variable twice: {result['env']}"
    return dict(item.partition("=")[::2] for item in result["env"]), result["devices"]
