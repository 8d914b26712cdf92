"""What the DRA driver serves of its node now, with one owner.

The slice content and PCIe roots the hardware's last view gives, which the driver, the claims' state and the node's
services read.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ix_device_plugin.dra.metadata import NodeFacts
from ix_device_plugin.dra.slices import SliceContent, SlicePolicy, slice_content
from ix_device_plugin.hardware.pcie import pcie_roots
from ix_device_plugin.hardware.view import HardwareView
from ix_device_plugin.settings.health import HealthPolicy

log = logging.getLogger(__name__)


class Served:
    """The slice content (how the chips are offered: policy) and the PCIe roots by chip UUID, as the slice says them.

    known: a view of the hardware was taken (the facts are the node's, not empty); changed: set at each change, for
    the claims' device metadata to follow.
    """

    def __init__(self, policy: SlicePolicy, health: HealthPolicy, sysfs_root: Path) -> None:
        self.content = SliceContent((), None, policy=policy)
        self.roots: dict[str, str] = {}
        self.known = False
        self.changed = asyncio.Event()
        self._health = health
        self._sysfs_root = sysfs_root

    def take(self, view: HardwareView) -> bool:
        """Serve what view shows; True when that changed anything (the new content's warnings said once)."""
        content = slice_content(view.inventory, self._health, self.content.policy)
        roots = pcie_roots(view.inventory, self._sysfs_root)
        if content == self.content and roots == self.roots:
            return False
        for warning in content.warnings:
            if warning not in self.content.warnings:
                log.warning("%s", warning)
        self.content, self.roots = content, roots
        self.known = True
        self.changed.set()
        return True

    def facts(self) -> NodeFacts:
        """What the node publishes of its devices now, as the claims' device metadata says it."""
        return NodeFacts(self.content, self.roots, known=self.known)
