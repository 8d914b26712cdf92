"""Whether this process can reset a chip here, known before any reset and said with what is missing.

ixsmi -r unbinds and rebinds the chip through the driver's sysfs directory, which takes CAP_SYS_ADMIN and a writable
/sys. An unprivileged container has neither, and ixsmi would fail only after the agent had taken the chip away from
its users; so the answer is found first, and said where an operator looks (the helper's log and `status`, the
agent's reset refusal).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ix_device_plugin.settings.options import NodeOptions

CAP_SYS_ADMIN = 21  # linux/capability.h
PROC_STATUS = Path("/proc/self/status")
IXML_DRIVER = "iluvatar"  # the kernel driver ixsmi unbinds and rebinds the chip through


def effective_capabilities(status_text: str) -> int | None:
    """The effective capability set (CapEff, hexadecimal) of a /proc/<pid>/status text; None when it has none."""
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name == "CapEff":
            try:
                return int(value.strip(), 16)
            except ValueError:
                return None
    return None


def has_capability(status_text: str, capability: int) -> bool:
    """True when the effective set in status_text holds capability (a bit number of linux/capability.h)."""
    capabilities = effective_capabilities(status_text)
    return capabilities is not None and bool(capabilities >> capability & 1)


def local_reset_problem(drivers_dir: Path, status_path: Path = PROC_STATUS) -> str | None:
    """None when this process can reset chips (CAP_SYS_ADMIN in its effective set, and drivers_dir a directory it
    may write); else one sentence naming exactly what is missing."""
    missing = []
    if not _has_sys_admin(status_path):
        missing.append("this process lacks CAP_SYS_ADMIN")
    if (problem := _not_writable(drivers_dir)) is not None:
        missing.append(problem)
    return " and ".join(missing) or None


def reset_drivers_dir(options: NodeOptions) -> Path:
    """The sysfs directory a reset writes, for the options' backend (drivers_dir)."""
    return drivers_dir(options.sysfs_root, simulated=options.backend == "simulated")


def drivers_dir(sysfs_root: Path, *, simulated: bool) -> Path:
    """The sysfs directory a reset writes: the Iluvatar driver's for IXML; for the simulated backend the drivers
    directory above it (a test machine has no Iluvatar driver), as strict otherwise."""
    drivers = sysfs_root / "bus" / "pci" / "drivers"
    return drivers if simulated else drivers / IXML_DRIVER


def _has_sys_admin(status_path: Path) -> bool:
    try:
        text = status_path.read_text(errors="replace")
    except OSError:
        return False
    return has_capability(text, CAP_SYS_ADMIN)


def _not_writable(directory: Path) -> str | None:
    """Why directory cannot be written by this process, or None when it can."""
    try:
        if not stat.S_ISDIR(os.stat(directory).st_mode):
            return f"{directory} is not a directory"
    except FileNotFoundError:
        return f"{directory} does not exist"
    except OSError as error:
        return f"{directory} cannot be looked at: {error.strerror or error}"
    if os.access(directory, os.W_OK):
        return None
    if _read_only_mount(directory):
        return f"{directory} is not writable (read-only mount)"
    return f"{directory} is not writable by this process"


def _read_only_mount(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False
