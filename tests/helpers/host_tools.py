"""What a test needs of the host beyond what the README's first command installs, under one rule.

The README's first command installs the plugin and its Python test dependencies, nothing else. Some tests need
more: helm, podman with runc and a static busybox, a C compiler, openssl, the CDI library's cdi-validate (built by
`make e2e-build`), root. Where one is missing:

- outside CI the test is skipped with the reason (what is missing and how to get it), so the README's second
  command is green on a fresh machine;
- in CI (`CI=true`), where .ci/run provides every one of them (e2e/cluster/packages.sh, `make e2e-build`, root),
  the test fails with the same reason: a test that did not run proved nothing and must not pass as green.

The end-to-end suite follows the same rule for its scenarios (e2e/harness/skips.py, whose `in_ci` this uses).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from e2e.harness.skips import in_ci

CI_FAILURE = "CI=true, where .ci/run provides this, so its absence is a failure"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "e2e" / "cluster" / "build.sh"


def e2e_tool(name: str, variable: str) -> Path:
    """Where the end-to-end build keeps its tool name (`$<variable>` names another); it may not be built."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    found = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, timeout=60, check=False
    )
    return Path(found.stdout.strip()) / "bin" / name


def missing(reason: str, *, ci_provides: bool = True) -> NoReturn:
    """Skip the test for reason; in CI fail it instead, unless ci_provides is False (a tool .ci/run does not
    install, whose test stays a skip there too)."""
    if ci_provides and in_ci():
        pytest.fail(f"{reason} ({CI_FAILURE})", pytrace=False)
    pytest.skip(reason)


def require(reason: str | None) -> None:
    """missing(reason) when there is a reason; nothing when it is None (the tool is here)."""
    if reason is not None:
        missing(reason)


@contextlib.contextmanager
def tmpfs(mount: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at mount (an existing directory) with options, unmounted afterwards; needs root."""
    if os.geteuid() != 0:
        missing("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        missing(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def cap_sys_admin_missing() -> str | None:
    """Why this process cannot reset chips for a test (a reset needs CAP_SYS_ADMIN: hardware/resetaccess.py), or
    None. CI runs as root with it; a developer's unprivileged shell or container lacks it."""
    from ix_device_plugin.hardware.resetaccess import CAP_SYS_ADMIN, PROC_STATUS, has_capability

    if has_capability(PROC_STATUS.read_text(errors="replace"), CAP_SYS_ADMIN):
        return None
    return "a GPU reset needs CAP_SYS_ADMIN, which this process lacks: run the tests as root with it (CI does)"
