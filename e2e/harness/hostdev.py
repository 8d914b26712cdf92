"""What a container reaches of the host's /dev beyond its device nodes: the host's terminals (a root pty, whose
reader sees what an operator types and whose writer writes to their screen) and its shared memory.

A container that mounts the host's /dev gets, with it, its /dev/pts and /dev/shm (a CRI bind mount is recursive, and
`readOnly` holds for its top only); the chart lays empty folders of the pod's own over both. Looked at two ways:

- through the container's own root (`/proc/<pid>/root`, the container's mounts as its processes see them), for every
  container, the injector's too (its image has no shell): is a pty the test holds open, and a file the test wrote in
  the host's /dev/shm, there?
- from inside, where the container has a shell: opening that pty read-write, and writing a file into its /dev/shm
  that the host must not see.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .cluster import Cluster
from .kube import Kubectl, KubectlError, Obj

HOST_SHM = Path("/dev/shm")


@dataclass(frozen=True)
class HostProbe:
    """A pty of the host (held open by the test: /dev/pts/<n>) and a file in the host's /dev/shm."""

    pty: str
    shm_file: str


@contextlib.contextmanager
def host_probe() -> Iterator[HostProbe]:
    """A host pty and a host shared-memory file for the checks, closed and removed after."""
    master, slave = os.openpty()
    name = f"ix-e2e-probe-{uuid.uuid4().hex[:12]}"
    (HOST_SHM / name).write_text("the host's\n")
    try:
        yield HostProbe(os.ttyname(slave), name)
    finally:
        os.close(master)
        os.close(slave)
        (HOST_SHM / name).unlink(missing_ok=True)


def container_pid(cluster: Cluster, pod: Obj, container: str) -> int:
    """The host PID of the running container's first process (its containerd task), found by the ID the kubelet
    reports (containers and native sidecars alike)."""
    statuses = [*pod["status"].get("initContainerStatuses", []), *pod["status"].get("containerStatuses", [])]
    (status,) = [s for s in statuses if s["name"] == container]
    container_id = status["containerID"].removeprefix("containerd://")
    for line in cluster.ctr("tasks", "ls").stdout.splitlines()[1:]:  # type: ignore[attr-defined]
        fields = line.split()
        if fields and fields[0] == container_id:
            return int(fields[1])
    raise AssertionError(f"no containerd task for {container} ({container_id})")


def seen_through_root(pid: int, dev: str, probe: HostProbe) -> list[str]:
    """What of the host the container's view of dev (its /dev, or where it mounts the host's) shows: the pty and
    the shared-memory file, by name."""
    root = Path(f"/proc/{pid}/root") / dev.lstrip("/")
    seen = []
    pty = root / probe.pty.removeprefix("/dev/")
    with contextlib.suppress(OSError):
        os.close(os.open(pty, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK))
        seen.append(f"{dev}/{probe.pty.removeprefix('/dev/')} (the host's pty, opened read-write)")
    if (root / "shm" / probe.shm_file).exists():
        seen.append(f"{dev}/shm/{probe.shm_file} (the host's shared memory)")
    return seen


def seen_from_inside(admin: Kubectl, namespace: str, pod: str, container: str, dev: str, probe: HostProbe) -> list[str]:
    """From a shell in the container: the host's pty opened read-write, and a file written into dev/shm that shows
    on the host."""
    seen = []
    pty = f"{dev}/{probe.pty.removeprefix('/dev/')}"
    written = f"ix-e2e-inside-{uuid.uuid4().hex[:12]}"
    # The open in a subshell: a failed redirection of `exec` ends the shell (dash). A character device only: `<>`
    # would create a plain file where the path is free and writable.
    opened = f"[ -c {pty} ] && (exec 3<>{pty}) 2>/dev/null && echo OPENED"
    script = f"{opened}; echo x > {dev}/shm/{written} && echo WROTE; true"
    try:
        output = admin("exec", pod, "-n", namespace, "-c", container, "--", "sh", "-c", script)
    except KubectlError as error:
        raise AssertionError(f"the probe did not run in {pod}/{container}: {error}") from None
    if "OPENED" in output:
        seen.append(f"{pty} opened read-write from inside")
    if (HOST_SHM / written).exists():
        (HOST_SHM / written).unlink()
        seen.append(f"{dev}/shm/{written}, written from inside, on the host")
    return seen
