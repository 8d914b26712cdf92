"""The host's device nodes: a chip is usable only while its /dev/iluvatar<minor> exists.

Shared by the backends and the daemon; dev_root is where the host's /dev is mounted (usually /).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import replace
from pathlib import Path

from ix_device_plugin.core.inventory import Chip, ChipStatus, Inventory, device_node_missing

# The control node every container with a GPU also gets, where the host has it.
CONTROL_NODE = "/dev/itrctl"
_GPU_NODE_NAME = re.compile(r"iluvatar\d+|itrctl")
# How the agent's container gets the nodes it opens (the chart's value, and the docs' section).
DEVICE_ACCESS_FIX = (
    "give the agent's container the GPU device nodes: the chart's NRI injector (deviceInjection=nri, the default, "
    "with NRI on in the node's runtime), privileged=true, or a runtime that injects them "
    '(docs/deployment.md, "Device access without privileged")'
)


def control_nodes(dev_root: str | Path) -> tuple[str, ...]:
    """The shared control device nodes (e.g. /dev/itrctl) present under dev_root, as host paths."""
    return (CONTROL_NODE,) if _host_path(dev_root, CONTROL_NODE).exists() else ()


def device_node_problem(chip: Chip, dev_root: str | Path) -> str | None:
    """Why the chip's /dev/iluvatar<minor> node makes it unusable, or None when it exists."""
    node = chip.device_node
    if node is None or _host_path(dev_root, node).exists():
        return None
    return device_node_missing(node)


def check_device_nodes(inventory: Inventory, dev_root: str | Path) -> Inventory:
    """The inventory with missing chip device nodes as problems and control_nodes as found under dev_root."""
    boards = tuple(
        replace(board, chips=tuple(_with_node_check(chip, dev_root) for chip in board.chips))
        for board in inventory.boards
    )
    return replace(inventory, boards=boards, control_nodes=control_nodes(dev_root))


def _with_node_check(chip: Chip, dev_root: str | Path) -> Chip:
    status = node_checked_status(chip, dev_root)
    return chip if status is chip.status else replace(chip, status=status)


def node_checked_status(chip: Chip, dev_root: str | Path) -> ChipStatus:
    """The chip's status, with a problem added when its device node is missing."""
    problem = device_node_problem(chip, dev_root)
    if problem is None or problem in chip.status.problems:
        return chip.status
    return chip.status.with_problem(problem)


def _host_path(dev_root: str | Path, node: str) -> Path:
    return Path(dev_root) / node.lstrip("/")


def with_control_nodes(inventory: Inventory, dev_root: str | Path) -> Inventory:
    """inventory with the control nodes found under dev_root; chips are left as they are."""
    present = control_nodes(dev_root)
    return inventory if present == inventory.control_nodes else replace(inventory, control_nodes=present)


def device_access_problem(dev_root: str | Path) -> str | None:
    """One line naming the first GPU device node under dev_root that this process may not open, and the fix; None
    when it may open them all (or there are none).

    A container's device cgroup refuses to open a node the runtime did not give it (EPERM) although the host's /dev
    is mounted and the node is there; IXML would then fail or see nothing, so the agent says why before it starts.
    """
    for node in _gpu_device_nodes(Path(dev_root) / "dev"):
        try:
            os.close(os.open(node, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))
        except PermissionError as error:
            return f"cannot open /dev/{node.name} ({error.strerror}): no GPU access here; {DEVICE_ACCESS_FIX}"
        except OSError:
            continue  # e.g. ENXIO, no driver behind the node: IXML's to report, not an access problem
    return None


def _gpu_device_nodes(dev: Path) -> list[Path]:
    try:
        names = sorted(entry.name for entry in os.scandir(dev) if _GPU_NODE_NAME.fullmatch(entry.name))
    except OSError:
        return []
    return [dev / name for name in names if _is_char_device(dev / name)]


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.lstat().st_mode)
    except OSError:
        return False
