"""Who holds a chip in device plugin mode: the healer's ChipGuard, from the kubelet's pod-resources API.

A chip is held when a container holds any device ID that stands for it under any resource name (core/holding.py):
the name served now, one served before a rename or a `renameByDefault` change, `.shared`, and devices of the DRA
driver's claims (a pod from before the node moved to the device plugin). A chip whose holders cannot be known is
held.

The node's reset turn is the one every pod of the agent on the node shares in either mode (runtime/noderole.py). A
chip the healer reserved is Unhealthy in the served plan, so Allocate refuses it and the kubelet gives it to no one;
`served` waits until the plan says so, then for an Allocate answered just before to show in pod-resources.

A board's first chip's ID names the chip on a split node, and the whole board otherwise; it is read as the chip only
while every plan served since whole boards were last held split the boards (a config changed from whole boards to
split may leave a container holding a board under that ID). That whole boards were served is kept for the boot in
`<kubelet plugins dir>/iluvatar.com/whole-boards-served` (the boot's ID), so a restarted pod reads such an ID as the
board too; once a split plan is served and no container holds a board's first chip's ID, it is forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from ix_device_plugin.core.holding import chip_holder, describe, unknown_holder
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.plan import REPLICA_SEPARATOR
from ix_device_plugin.core.telemetry import Holdings
from ix_device_plugin.deviceplugin.state import Current, State
from ix_device_plugin.hardware.monitor import HardwareView
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.kubelet.podresources import PodResources, PodResourcesError
from ix_device_plugin.runtime.files import OutputError, read_boot_id, remove_file, write_atomically
from ix_device_plugin.runtime.locks import TurnLock
from ix_device_plugin.settings.documents import DocumentError, read_file

DRA_DRIVER = "gpu.iluvatar.com"  # the DRA driver's claims hold chips too, where a node moved from DRA
WHOLE_BOARDS_FILE = "whole-boards-served"  # beside the node-health record
MARK_LIMIT = 256  # bytes: a boot ID is 37

log = logging.getLogger(__name__)


class WholeBoardsMark:
    """That a plan of whole multi-chip boards was served in this boot (path None: this process alone remembers it).

    The file holds the boot's ID: from another boot, missing or saying anything else, it says nothing (no container
    outlives a reboot); one that cannot be read says yes (a reset waits rather than hit a board someone holds).
    """

    def __init__(self, path: Path | None, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id

    @classmethod
    def beside(cls, record: RecordFile | None) -> WholeBoardsMark:
        """The mark beside the node-health record (none without one), for this boot."""
        return cls(None if record is None else record.path.parent / WHOLE_BOARDS_FILE, read_boot_id())

    def read(self) -> bool:
        if self.path is None:
            return False
        try:
            return read_file(self.path, MARK_LIMIT, follow_symlinks=False).strip() == self.boot_id.encode()
        except FileNotFoundError:
            return False
        except DocumentError as error:  # a symlink, a FIFO, a directory, too large: say yes, a reset waits
            log.warning("cannot read %s (%s): a board's first chip's ID is read as the board", self.path, error)
            return True

    def mark(self) -> None:
        if self.path is not None:
            try:
                write_atomically(self.path, self.boot_id + "\n")
            except OutputError as error:
                log.warning("%s: a restarted plugin may read a board's first chip's ID as that chip alone", error)

    def forget(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OutputError):
                remove_file(self.path)


class PodHolders:
    """The device plugin's ChipGuard: the node's reset turn, the served plan, and pod-resources.

    applied: returns once the reconcile loop serves a hardware view of at least that version; settle: seconds an
    Allocate answered just before a hold needs to show in pod-resources; reset_turn: the node's (its paths empty:
    this process alone resets); turn_timeout: how long the plan's hold is waited for.
    """

    def __init__(
        self,
        pod_resources: PodResources,
        current: Current,
        applied: Callable[[int], Awaitable[None]],
        *,
        settle: float,
        reset_turn: TurnLock,
        turn_timeout: float,
        whole_boards: WholeBoardsMark | None = None,
    ) -> None:
        self._pod_resources = pod_resources
        self._current = current
        self._applied = applied
        self._settle = settle
        self._reset_turn = reset_turn
        self._turn_timeout = turn_timeout
        self._mark = whole_boards or WholeBoardsMark(None, "")
        self._whole_boards_served = self._mark.read()  # whole multi-chip boards served, maybe still held

    def turn(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The node's reset turn (OutputError when another pod keeps it past its timeout)."""
        return self._reset_turn.held()

    async def served(self, view: HardwareView) -> None:
        """Once the plan served holds view's holds, and an Allocate answered before it shows in pod-resources;
        OutputError when the plan does not take them within turn_timeout."""
        try:
            async with asyncio.timeout(self._turn_timeout):
                await self._applied(view.version)
        except TimeoutError:
            raise OutputError(f"the plugin did not serve the chip's hold within {self._turn_timeout:g}s") from None
        await asyncio.sleep(self._settle)

    async def holder(self, uuid: str) -> str | None:
        """The container holding the chip (`namespace/pod (container)`), why that is not known, or None when free."""
        inventory = self._current.state.inventory
        try:
            holdings = await self._pod_resources.read_holdings()
        except PodResourcesError as error:
            return unknown_holder("a container", error)
        self._forget_whole_boards_none_holds(holdings, inventory)
        ref = chip_holder(uuid, holdings, inventory, DRA_DRIVER, self._split_only())
        return None if ref is None else describe(ref)

    def _forget_whole_boards_none_holds(self, holdings: Holdings, inventory: Inventory) -> None:
        """Split boards served and no container holding a board's first chip's ID: no one holds a whole board."""
        if not self._whole_boards_served or not self._current.state.config.splitboard:
            return
        firsts = {board.uuid for board in inventory.boards if len(board.chips) > 1}
        if not any(device_id.partition(REPLICA_SEPARATOR)[0] in firsts for _, device_id, _ in holdings.devices):
            self._whole_boards_served = False
            self._mark.forget()

    def saw(self, state: State) -> None:
        """The reconcile loop serves state from now on (remembered: whether it served whole multi-chip boards)."""
        if not state.config.splitboard and any(len(board.chips) > 1 for board in state.inventory.boards):
            if not self._whole_boards_served:
                self._mark.mark()
            self._whole_boards_served = True

    def _split_only(self) -> bool:
        """True while every plan this process served split the boards (so a first chip's ID names that chip)."""
        self.saw(self._current.state)
        return not self._whole_boards_served
