"""The NRI device injector (nri-injector/) for the end-to-end node: its static binary built here with Go (no
registry, no image builder), cached by a hash of its sources, in an OCI archive as the chart names the image.

It shares e2e/cluster/build.sh's Go module and build caches, so a warm cache builds it in seconds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from . import images
from .build import REPO_ROOT
from .procs import run

SOURCE_DIR = REPO_ROOT / "nri-injector"
BINARY = "ix-nri-injector"


def sources_hash() -> str:
    """A hash of what the binary is built from: the Go files (tests left out) and the module files."""
    digest = hashlib.sha256()
    files = [p for p in sorted(SOURCE_DIR.iterdir()) if p.name in ("go.mod", "go.sum") or p.suffix == ".go"]
    for path in (p for p in files if not p.name.endswith("_test.go")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_binary(cache: Path) -> tuple[Path, float]:
    """The static binary for the current sources (built when not cached), and the seconds building took."""
    binary = cache / "nri-injector" / f"{BINARY}-{sources_hash()}"
    if binary.exists():
        return binary, 0.0
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false")
    env.update(GOMODCACHE=str(cache / "go" / "mod"), GOCACHE=str(cache / "go" / "build"))
    go = shutil.which("go") or "/usr/local/go/bin/go"  # where build.sh finds it too
    started = time.monotonic()
    run(
        [go, "build", "-C", str(SOURCE_DIR), "-trimpath", "-ldflags=-s -w", "-o", str(partial), "."],
        timeout=900,
        env=env,
    )
    partial.rename(binary)
    return binary, time.monotonic() - started


def image_name(version: str) -> str:
    """The chart's nriInjector.image (ix-nri-injector, the chart's appVersion) as the kubelet resolves it."""
    return f"docker.io/library/ix-nri-injector:{version}"


def injector_image(binary: Path, version: str) -> bytes:
    """The OCI archive of the injector's image: the binary alone, as nri-injector/Dockerfile makes it."""
    entries = [images.FileEntry(BINARY, binary.read_bytes())]
    return images.oci_archive(image_name(version), entries, [f"/{BINARY}"])
