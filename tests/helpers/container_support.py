"""Run real containers with podman in a throw-away sandbox, to check what a CDI spec gives a container.

Everything podman writes goes under one temporary directory: image storage (`--root`), run state
(`--runroot`, `--tmpdir`), its config (`CONTAINERS_CONF`) and the containers' cgroups (a parent named for
the sandbox, removed afterwards). Podman reads CDI specs from /etc/cdi and /var/run/cdi; releases that
have the global `--cdi-spec-dir` flag are pointed at the sandbox's directory with it, older ones run in a
private mount namespace where a tmpfs covers /run (so /var/run/cdi is the sandbox's directory) and /etc/cdi
when the host has one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from helpers.host_tools import missing, require

BUSYBOX = Path("/bin/busybox")
IMAGE = "localhost/ix-device-plugin-busybox:test"
CGROUP_ROOT = Path("/sys/fs/cgroup")
COMMAND_TIMEOUT_S = 60
CLEANUP_WAIT_S = 5
CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
events_logger = "none"
"""


@contextlib.contextmanager
def podman_sandbox(prefix: str) -> Iterator[PodmanSandbox]:
    """A sandbox with IMAGE imported that has run a container; closed afterwards.

    Where podman is not installed or cannot run a container here (no namespaces, no cgroups), the test is
    skipped saying why, and fails in CI (host_tools)."""
    require(podman_unavailable())
    sandbox = PodmanSandbox(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        sandbox.import_busybox()
        # Before any spec exists: a failure here is the host's, not the spec's.
        probe = sandbox.run(IMAGE, "ls", "/")
        if probe.returncode != 0:
            missing(f"podman cannot run containers here: {probe.stderr.strip().splitlines()[-1:]}")
        yield sandbox
    finally:
        sandbox.close()


def podman_unavailable() -> str | None:
    """Why podman containers cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (podman with a private storage root and device nodes made by mknod)"
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman runc busybox-static)"
    if not BUSYBOX.is_file():
        return f"{BUSYBOX} is missing (apt-get install busybox-static)"
    if not _has_cdi_spec_dir_flag() and shutil.which("unshare") is None:
        return "podman lacks --cdi-spec-dir and unshare is missing to give it a private /var/run/cdi"
    return None


@functools.cache
def _has_cdi_spec_dir_flag() -> bool:
    result = subprocess.run(
        ["podman", "--help"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    return "--cdi-spec-dir" in result.stdout


def make_char_device(path: Path) -> None:
    """A character device node at path with /dev/null's numbers (1:3), standing in for a GPU node."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


class PodmanSandbox:
    """Podman with all its state under directory; `close()` removes that and the cgroups it made."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cdi_dir = directory / "cdi"
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        for name in ("root", "runroot", "tmp"):
            (directory / name).mkdir(exist_ok=True)
        self._conf = directory / "containers.conf"
        self._conf.write_text(CONTAINERS_CONF)
        self._cgroup_parent = f"ix-device-plugin-test-{uuid.uuid4().hex[:12]}"

    def podman(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `podman <args>` in the sandbox; the result is returned whatever the exit code."""
        command = [
            "podman",
            "--root", str(self.directory / "root"),
            "--runroot", str(self.directory / "runroot"),
            "--tmpdir", str(self.directory / "tmp"),
            "--storage-driver", "vfs",
            "--cgroup-manager", "cgroupfs",
            "--runtime", "runc",
        ]  # fmt: skip
        if _has_cdi_spec_dir_flag():
            argv = [*command, "--cdi-spec-dir", str(self.cdi_dir), *args]
        else:
            # sh -c SCRIPT NAME ARGS...: NAME becomes $0 and ARGS "$@".
            argv = ["unshare", "--mount", "sh", "-c", self._private_cdi_dirs(command), "podman", *args]
        environment = {**os.environ, "CONTAINERS_CONF": str(self._conf)}
        return subprocess.run(
            argv, capture_output=True, text=True, env=environment, timeout=COMMAND_TIMEOUT_S, check=False
        )

    def _private_cdi_dirs(self, podman: list[str]) -> str:
        # `mount -n` keeps the host's /run/mount/utab untouched; "$@" carries podman's arguments.
        steps = [
            "mount -n -t tmpfs tmpfs /run",
            "mkdir /run/cdi",
            f"mount -n --bind {shlex.quote(str(self.cdi_dir))} /run/cdi",
        ]
        if Path("/etc/cdi").is_dir():
            steps.append("mount -n -t tmpfs tmpfs /etc/cdi")
        return " && ".join([*steps, f'exec {shlex.join(podman)} "$@"'])

    def import_busybox(self) -> None:
        """Make the image IMAGE: a static busybox with `sh` and `ls` links."""
        archive = self.directory / "busybox.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(BUSYBOX, arcname="bin/busybox")
            for applet in ("sh", "ls"):
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type = tarfile.SYMTYPE
                link.linkname = "busybox"
                tar.addfile(link)
        result = self.podman("import", str(archive), IMAGE)
        if result.returncode != 0:
            raise RuntimeError(f"podman import failed ({result.returncode}): {result.stderr.strip()}")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`podman run --rm` in the sandbox, without network and in the sandbox's cgroup parent."""
        return self.podman("run", "--rm", "--network", "none", f"--cgroup-parent=/{self._cgroup_parent}", *args)

    def close(self) -> None:
        """Remove the sandbox's cgroups, then its directory.

        conmon can outlive a failed `podman run` for a moment, keeping its cgroup busy: removal is retried
        for up to CLEANUP_WAIT_S.
        """
        deadline = time.monotonic() + CLEANUP_WAIT_S
        while self._remove_cgroups() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _remove_cgroups(self) -> bool:
        """Try once to remove the cgroups; True while some remain."""
        tops = [*CGROUP_ROOT.glob(f"*/{self._cgroup_parent}"), CGROUP_ROOT / self._cgroup_parent]
        remaining = False
        for top in (path for path in tops if path.is_dir()):
            directories = [path for path in top.rglob("*") if path.is_dir()]
            for directory in [*sorted(directories, key=lambda path: len(path.parts), reverse=True), top]:
                try:
                    directory.rmdir()
                except OSError:
                    remaining = True
        return remaining
