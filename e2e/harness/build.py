"""Where e2e/cluster/build.sh put the components for e2e/versions.env, or for a lane of e2e/lanes/.

A lane (IX_E2E_LANE=NAME, e2e/lanes/NAME.env) is KEY=value lines over versions.env: another Kubernetes or
containerd, built into a folder of its own, and CONTAINERD_NRI=on|off, which only containerd's configuration
reads. No IX_E2E_LANE (or an empty one) is the default lane: versions.env alone.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .components import Binaries, Stack

E2E_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = E2E_DIR.parent
BUILD_SCRIPT = E2E_DIR / "cluster" / "build.sh"
VERSIONS_FILE = E2E_DIR / "versions.env"
LANES_DIR = E2E_DIR / "lanes"
LANE_VARIABLE = "IX_E2E_LANE"
CACHE = Path(os.environ.get("IX_E2E_CACHE") or "/var/cache/ix-device-plugin-e2e")


def current_lane() -> str:
    """The lane of this run: $IX_E2E_LANE, "" for the default lane."""
    return os.environ.get(LANE_VARIABLE, "").strip()


def lanes() -> list[str]:
    """The lanes there are (e2e/lanes/*.env), by name."""
    return sorted(path.name.removesuffix(".env") for path in LANES_DIR.glob("*.env"))


def read_env(path: Path) -> dict[str, str]:
    """A file of KEY=value lines (comments and blank lines skipped) as a dict."""
    pairs = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pairs[key] = value
    return pairs


def lane_file(lane: str) -> Path:
    """e2e/lanes/<lane>.env; ValueError naming the lanes there are when it is not one."""
    path = LANES_DIR / f"{lane}.env"
    if lane not in lanes():
        raise ValueError(f"no lane {lane!r} (the lanes: {', '.join(lanes())})")
    return path


def versions(lane: str | None = None) -> dict[str, str]:
    """e2e/versions.env as a dict, with lane's lines over it (lane: the current one when None, "" the default)."""
    lane = current_lane() if lane is None else lane
    pairs = read_env(VERSIONS_FILE)
    if lane:
        pairs.update(read_env(lane_file(lane)))
    return pairs


def stack(lane: str | None = None) -> Stack:
    """The releases lane's cluster runs and whether its containerd serves NRI (lane as for versions)."""
    return Stack.of(versions(lane))


def built_binaries(lane: str | None = None) -> tuple[Binaries | None, str]:
    """The built components of lane (the current one when None), or None and why not (the folder build.sh would use
    is not complete, or one of its binaries fails `build.sh --verify`: a cache this build did not check).
    """
    if os.environ.get("IX_E2E_BIN_DIR"):
        bin_dir = Path(os.environ["IX_E2E_BIN_DIR"])
        return Binaries(bin_dir, bin_dir.parent / "cni" / "bin"), ""
    lane = current_lane() if lane is None else lane
    if lane:
        try:
            lane_file(lane)
        except ValueError as error:
            return None, str(error)
    env = {**os.environ, LANE_VARIABLE: lane}
    script = BUILD_SCRIPT.relative_to(REPO_ROOT)
    build = f"`make e2e-build` (or {script})" if not lane else f"`{script} {lane}` (or `make e2e-build-lanes`)"
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    folder = Path(result.stdout.strip())
    if result.returncode != 0:
        return None, f"{folder} is not complete: run {build} first"
    verified = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--verify"], capture_output=True, text=True, timeout=300, check=False, env=env
    )
    if verified.returncode != 0:
        return None, f"{verified.stderr.strip()}\nrun {build} to rebuild them"
    return Binaries(folder / "bin", folder / "cni" / "bin"), ""
