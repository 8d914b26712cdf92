"""The slot this end-to-end process runs in (e2e/cluster/slot.sh, started by e2e/run.py), and the names that are its
own: its cgroup root, its lock and record in the build cache, its network namespace.

In a slot the network, /dev and the kubelet's fixed folders are already private (slot.sh); the cgroup hierarchy is
not, so each slot's cluster has a cgroup root of its own. Outside a slot (`pytest e2e/tests` run directly) the
names are the host's, as they always were, and one run holds the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

from .build import E2E_DIR

SLOT_VARIABLE = "IX_E2E_SLOT"
SLOT_SCRIPT = E2E_DIR / "cluster" / "slot.sh"
HOST_CGROUP_ROOT = "ix-e2e"


def number() -> int | None:
    """The slot's number ($IX_E2E_SLOT), None outside a slot."""
    value = os.environ.get(SLOT_VARIABLE, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise AssertionError(f"{SLOT_VARIABLE}={value!r}: a slot is a number (e2e/cluster/slot.sh sets it)")
    return int(value)


def cgroup_root(slot: int | None = None) -> str:
    """The cluster's cgroup root (the kubelet's --cgroup-root): ix-e2e, or ix-e2e-slot<N> in slot N."""
    return HOST_CGROUP_ROOT if slot is None else f"{HOST_CGROUP_ROOT}-slot{slot}"


def run_files(cache: Path, slot: int | None = None) -> tuple[Path, Path]:
    """The lock a run holds for its lifetime and the record of its work directory (harness/runs.py)."""
    suffix = "" if slot is None else f"-slot{slot}"
    return cache / f"run{suffix}.lock", cache / f"current-run{suffix}.json"


def netns(pid: int | str = "self") -> str | None:
    """The network namespace of process pid, as /proc names it (net:[inode]); None when it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
