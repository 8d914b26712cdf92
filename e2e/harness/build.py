"""Where e2e/cluster/build.sh put the components for e2e/versions.env."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .components import Binaries

E2E_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = E2E_DIR.parent
BUILD_SCRIPT = E2E_DIR / "cluster" / "build.sh"
VERSIONS_FILE = E2E_DIR / "versions.env"
CACHE = Path(os.environ.get("IX_E2E_CACHE") or "/var/cache/ix-device-plugin-e2e")


def versions() -> dict[str, str]:
    """e2e/versions.env as a dict."""
    pairs = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pairs[key] = value
    return pairs


def built_binaries() -> tuple[Binaries | None, str]:
    """The built components, or None and why not (the folder build.sh would use is not complete, or one of its
    binaries fails `build.sh --verify`: a cache this build did not check).
    """
    if os.environ.get("IX_E2E_BIN_DIR"):
        bin_dir = Path(os.environ["IX_E2E_BIN_DIR"])
        return Binaries(bin_dir, bin_dir.parent / "cni" / "bin"), ""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, timeout=60, check=False
    )
    folder = Path(result.stdout.strip())
    script = BUILD_SCRIPT.relative_to(REPO_ROOT)
    if result.returncode != 0:
        return None, f"{folder} is not complete: run `make e2e-build` (or {script}) first"
    verified = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--verify"], capture_output=True, text=True, timeout=300, check=False
    )
    if verified.returncode != 0:
        return None, f"{verified.stderr.strip()}\nrun `make e2e-build` (or {script}) to rebuild them"
    return Binaries(folder / "bin", folder / "cni" / "bin"), ""
