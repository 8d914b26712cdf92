"""The host's device nodes: a chip is usable only while its /dev/iluvatar<minor> exists.

Shared by the backends and the daemon; dev_root is where the host's /dev is mounted (usually /).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ix_device_plugin.core.inventory import Chip, ChipStatus, Inventory, device_node_missing

# The control node every container with a GPU also gets, where the host has it.
CONTROL_NODE = "/dev/itrctl"


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
