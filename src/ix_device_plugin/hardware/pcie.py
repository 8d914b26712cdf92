"""Where each chip sits on PCIe, from sysfs: the root complex its bus ID resolves to."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ix_device_plugin.core.inventory import Inventory

_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


def pcie_root(device_path: str) -> str | None:
    """The PCIe root (`pci0000:00`) in the resolved sysfs path of a PCI device, None when there is none."""
    for part in device_path.split("/"):
        if _PCIE_ROOT.match(part):
            return part
    return None


def pcie_roots(inventory: Inventory, sysfs_root: Path) -> dict[str, str]:
    """The PCIe root of each chip's bus ID, resolved through `<sysfs>/bus/pci/devices/<bus id>`."""
    roots = {}
    for chip in inventory.chips():
        if not chip.bus_id:
            continue
        parts = chip.bus_id.lower().split(":")
        if len(parts) == 3 and len(parts[0]) == 8:  # IXML's 8-digit domain; sysfs has 4
            parts[0] = parts[0][-4:]
        link = sysfs_root / "bus" / "pci" / "devices" / ":".join(parts)
        root = pcie_root(os.path.realpath(link)) if link.exists() else None
        if root is not None:
            roots[chip.bus_id] = root
    return roots
