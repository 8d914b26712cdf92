"""Volcano's capacity plugin for the quota tests: e2e/cluster/tools/volcano-charge, built here with Go against the
Volcano release its go.mod pins, cached by a hash of its sources; and the cases it runs, as JSON.

A cold build downloads Volcano's modules and compiles its scheduler (minutes); a warm one takes seconds.
`$IX_VOLCANO_CHARGE` names a binary built elsewhere instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.build import CACHE
from helpers.host_tools import missing

SOURCE_DIR = Path(__file__).resolve().parents[2] / "e2e" / "cluster" / "tools" / "volcano-charge"
GO = shutil.which("go") or "/usr/local/go/bin/go"  # where e2e/cluster/build.sh finds it too


def sources_hash() -> str:
    """A hash of what the binary is built from: its Go files and module files."""
    digest = hashlib.sha256()
    for path in sorted(p for p in SOURCE_DIR.iterdir() if p.name in ("go.mod", "go.sum") or p.suffix == ".go"):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _cache_root() -> tuple[Path, dict[str, str]]:
    """Where the binary is kept, and Go's caches: the end-to-end build's when it may be written (shared with
    e2e/cluster/build.sh), else a folder of this user's with Go's own caches."""
    if os.access(CACHE, os.W_OK):
        go = CACHE / "go"
        return CACHE / "volcano-charge", {"GOMODCACHE": str(go / "mod"), "GOCACHE": str(go / "build")}
    return Path(tempfile.gettempdir()) / f"ix-volcano-charge-{os.getuid()}", {}


def _go(args: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GO, *args], cwd=SOURCE_DIR, env=env, capture_output=True, text=True, timeout=timeout)


def charge_tool() -> Path:
    """The volcano-charge binary for the current sources, built when not cached. Skips the test when Volcano's
    modules cannot be downloaded (also in CI: a module proxy that does not serve them is no tool to install) or Go
    is missing (fails it in CI); fails it when they do not build."""
    if os.environ.get("IX_VOLCANO_CHARGE"):
        return Path(os.environ["IX_VOLCANO_CHARGE"])
    if not Path(GO).is_file():
        missing("Go is not installed (go on PATH or /usr/local/go/bin): the Volcano quota check builds Volcano with it")
    root, go_caches = _cache_root()
    binary = root / f"volcano-charge-{sources_hash()}"
    if binary.is_file():
        return binary
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false", **go_caches)
    fetched = _go(["mod", "download"], env, timeout=900)
    if fetched.returncode != 0:  # a proxy that does not serve them (volcano.sh/apis v1.15.x): no tool CI installs
        why = f"cannot download Volcano's Go modules (the Go module proxy): {fetched.stderr.strip()[-500:]}"
        missing(why, ci_provides=False)
    root.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    built = _go(["build", "-trimpath", "-o", str(partial), "."], env, timeout=1800)
    if built.returncode != 0:
        pytest.fail(f"volcano-charge does not build: {built.stderr.strip()[-2000:]}", pytrace=False)
    partial.rename(binary)
    return binary


def run_cases(binary: Path, cases: list[dict[str, Any]], *, consumable_capacity: bool = True) -> dict[str, Any]:
    """What Volcano did with each case, by the case's name: {"allocated": [pod names], "queueAllocated": {...}}."""
    flag = f"-consumable-capacity={'true' if consumable_capacity else 'false'}"
    done = subprocess.run(
        [str(binary), flag], input=json.dumps({"cases": cases}), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"volcano-charge: {done.stderr}"
    return {case["name"]: case for case in json.loads(done.stdout)["cases"]}


def volcano_version(binary: Path) -> str:
    """The volcano.sh/volcano version the binary is built with (e.g. v1.15.1)."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]
