"""The host as the end-to-end cluster sees it: addresses and ports, mounts, cgroups, processes and links.

Read-only helpers (the primary address, free loopback ports, a GET that accepts self-signed certificates,
the mount table, the cgroup hierarchies and the processes in them, a containerd's shims) and the primitives
a teardown is made of: kill every process under a cgroup root, kill a containerd's shims, unmount everything
under a directory, remove a cgroup root from every hierarchy, delete a network link, remove the symlinks
that point into a directory. Each primitive raises when it could not finish.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

from .procs import run

# ---------------------------------------------------------------------- network


def primary_ip() -> str:
    """The address this host reaches the outside with (the kubelet refuses a loopback node IP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("203.0.113.1", 9))  # TEST-NET-3; no packet is sent: connect only picks the route
        return probe.getsockname()[0]


def free_ports(count: int) -> list[int]:
    """count distinct TCP ports free on loopback right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def http_get(url: str, timeout: float = 5) -> bytes:
    """GET url (TLS not verified: the components' self-signed serving certificates)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
        return response.read()


def delete_link(name: str) -> None:
    """Delete the network link name (a bridge), if there is one in this process's network namespace (asked of the
    kernel: /sys/class/net shows the namespace of whoever mounted /sys, the host's in a slot)."""
    if run(["ip", "link", "show", name], check=False, timeout=30).returncode == 0:
        run(["ip", "link", "delete", name], check=False, timeout=30)


# ---------------------------------------------------------------------- mounts


def _mountinfo() -> Iterator[tuple[str, str]]:
    """(mount point, filesystem type) of every mount in this mount namespace, in mount order."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        point = fields[4].encode().decode("unicode_escape")
        yield point, fields[separator + 1]


def bind_source(point: Path) -> str | None:
    """For a mount at point, the path within its filesystem that is mounted there (a bind's source)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4].encode().decode("unicode_escape") == str(point):
            return fields[3].encode().decode("unicode_escape")
    return None


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below directory, in mount order."""
    prefix = str(directory)
    return [point for point, _ in _mountinfo() if point == prefix or point.startswith(prefix + "/")]


def unmount_all(directory: Path, attempts: int = 5) -> None:
    """Unmount everything at or below directory, innermost first (lazily from the third attempt)."""
    for attempt in range(attempts):
        mounts = mounts_under(directory)
        if not mounts:
            return
        for mount in reversed(mounts):
            flag = ["-l"] if attempt >= 2 else []
            run(["umount", *flag, mount], check=False, timeout=30)
    remaining = mounts_under(directory)
    if remaining:
        raise AssertionError(f"could not unmount {remaining}")


def unmount(target: Path) -> None:
    """Unmount whatever is mounted at or below target: plainly, then lazily if that was not enough."""
    if mounts_under(target):
        run(["umount", str(target)], check=False, timeout=30)
    if mounts_under(target):
        run(["umount", "-l", str(target)], timeout=30)


# ---------------------------------------------------------------------- cgroups


def cgroup_mounts() -> list[Path]:
    """The cgroup v1 hierarchies' mount points."""
    return [Path(point) for point, kind in _mountinfo() if kind == "cgroup"]


def unified_mounts() -> list[Path]:
    """The cgroup v2 (unified) hierarchy's mount points."""
    return [Path(point) for point, kind in _mountinfo() if kind == "cgroup2"]


def cgroup_pids(root: str) -> set[int]:
    """Every process in any cgroup below /root, in any hierarchy."""
    pids: set[int] = set()
    for mount in [*cgroup_mounts(), *unified_mounts()]:
        base = mount / root
        if not base.exists():
            continue
        for procs in base.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids |= {int(pid) for pid in procs.read_text().split()}
    return pids


def make_cgroup_root(root: str) -> None:
    """/root in every cgroup v1 hierarchy (cpuset with its parent's CPUs and memory nodes), or, on a
    cgroup v2 host, in the unified hierarchy with its controllers delegated (not exercised on the v1 VM
    this suite was developed on).
    """
    for mount in cgroup_mounts():
        directory = mount / root
        directory.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (mount / name).exists() and not (directory / name).read_text().strip():
                (directory / name).write_text((mount / name).read_text())
    unified = Path("/sys/fs/cgroup")
    if unified in unified_mounts():
        directory = unified / root
        directory.mkdir(exist_ok=True)
        controllers = (unified / "cgroup.controllers").read_text().split()
        for parent in (unified, directory):
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in controllers))


def remove_cgroup_root(root: str) -> None:
    """Remove /root and every cgroup below it from every hierarchy (they must hold no process)."""
    for mount in [*cgroup_mounts(), *unified_mounts()]:
        base = mount / root
        if not base.exists():
            continue
        for directory in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()
        if base.exists():
            raise AssertionError(f"cgroup {base} could not be removed")


# ---------------------------------------------------------------------- processes


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kill_cgroup_processes(root: str, timeout: float = 30) -> None:
    """SIGKILL every process in a cgroup below /root until none is left (or raise after timeout seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = cgroup_pids(root)
        if not pids:
            return
        _kill(pids)
        time.sleep(0.2)
    raise AssertionError(f"processes left in /{root}: {sorted(cgroup_pids(root))}")


def shim_pids(containerd_address: str) -> list[int]:
    """containerd-shim-runc-v2 processes serving the containerd at containerd_address."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and containerd_address.encode() in argv:
            found.append(int(entry.name))
    return found


def kill_shims(containerd_address: str) -> None:
    """SIGKILL the runc shims of the containerd at containerd_address (they run outside its process group)."""
    _kill(shim_pids(containerd_address))


# ---------------------------------------------------------------------- files


def remove_links_into(links_dir: Path, directory: Path) -> None:
    """Remove the symlinks in links_dir whose target is under directory."""
    if not links_dir.is_dir():
        return
    for link in links_dir.iterdir():
        if link.is_symlink() and os.readlink(link).startswith(str(directory)):
            link.unlink()
