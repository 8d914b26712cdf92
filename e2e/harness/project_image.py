"""The project's own image, built offline the documented way (`make base-image`, `make image`) and saved as
an archive for containerd.

`make base-image` (debootstrap, minutes) runs when no base archive for the current scripts/build-base-image.sh
is in the cache; otherwise the cached base is loaded into buildah's store. `make image` runs every time, but for
clusters side by side (e2e/run.py): the image needs the package index, which a slot cannot reach, so run.py builds
it once beforehand and names the archive in PREPARED_VARIABLE.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .build import REPO_ROOT
from .procs import run

BASE_TAG = "localhost/ix-python-base:3.11-bookworm"
STORAGE = ["--storage-driver", os.environ.get("BUILDAH_STORAGE", "vfs")]
TOOLS = ("debootstrap", "buildah", "make")
PREPARED_VARIABLE = "IX_E2E_PROJECT_IMAGE"


@dataclass(frozen=True)
class BuiltImage:
    name: str  # as the engine named it, e.g. localhost/ix-device-plugin:0.1.0
    archive: Path
    seconds: dict[str, float]


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def package_version() -> str:
    text = (REPO_ROOT / "src" / "ix_device_plugin" / "__init__.py").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("__version__")]
    return line.split('"')[1]


def base_archive(cache: Path) -> Path:
    """The cache file of the base image built by the current scripts/build-base-image.sh."""
    script = (REPO_ROOT / "scripts" / "build-base-image.sh").read_bytes()
    return cache / "images" / f"ix-python-base-{hashlib.sha256(script).hexdigest()[:16]}.tar"


def buildah(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return run(["buildah", *STORAGE, *args], timeout=timeout)


def make(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """make in the repository, its output kept for a failure message."""
    return run(["make", "-C", str(REPO_ROOT), *args], timeout=timeout)


def ensure_base_image(cache: Path, seconds: dict[str, float]) -> None:
    """BASE_TAG in buildah's store: from the cache, or `make base-image` (then cached)."""
    archive = base_archive(cache)
    started = time.monotonic()
    if archive.exists():
        buildah("pull", f"docker-archive:{archive}")  # named BASE_TAG inside
        seconds["base image (cached)"] = time.monotonic() - started
        return
    make("base-image", f"LOCAL_BASE_IMAGE={BASE_TAG}")
    seconds["make base-image"] = time.monotonic() - started
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    buildah("push", BASE_TAG, f"docker-archive:{partial}:{BASE_TAG}")
    partial.rename(archive)


def build_project_image(cache: Path) -> BuiltImage:
    """`make image` on the offline base, then `make image-archive` (the archive a node imports)."""
    seconds: dict[str, float] = {}
    ensure_base_image(cache, seconds)
    version = package_version()
    started = time.monotonic()
    make("image", f"BASE_IMAGE={BASE_TAG}")
    seconds["make image"] = time.monotonic() - started
    make("image-archive")
    archive = REPO_ROOT / "dist" / f"ix-device-plugin-{version}-image.tar"
    return BuiltImage(image_name(version), archive, seconds)


def image_name(version: str) -> str:
    """What the manifests' `ix-device-plugin:<version>` means to the kubelet and containerd."""
    return f"docker.io/library/ix-device-plugin:{version}"


def prepared_project_image() -> BuiltImage | None:
    """The image archive built before this run ($IX_E2E_PROJECT_IMAGE, e2e/run.py), None when none was."""
    value = os.environ.get(PREPARED_VARIABLE, "").strip()
    if not value:
        return None
    archive = Path(value)
    if not archive.is_file():
        raise AssertionError(f"{PREPARED_VARIABLE}={value}: no such image archive")
    return BuiltImage(image_name(package_version()), archive, {})
