"""Who holds a chip in device plugin mode: the healer's ChipGuard, from the kubelet's pod-resources API.

A chip is held when a container holds any device ID that stands for it under any resource name (core/holding.py):
the name served now, one served before a rename or a `renameByDefault` change, `.shared`, and devices of the DRA
driver's claims (a pod from before the node moved to the device plugin). A chip whose holders cannot be known is
held.

The node's reset turn is a file lock beside the node-health record, shared by every pod of the agent on the node. A
chip the healer reserved is Unhealthy in the served plan, so Allocate refuses it and the kubelet gives it to no one;
`served` waits until the plan says so, then for an Allocate answered just before to show in pod-resources.

A board's first chip's ID names the chip on a split node, and the whole board otherwise; it is read as the chip only
while every plan served since the start split the boards (a config changed from whole boards to split may leave a
container holding a board under that ID). A restart forgets that history: after `splitboard` changed from false to
true live, restart the plugin only once no pod holds a whole board.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from ix_device_plugin.deviceplugin.state import Current, State
from ix_device_plugin.hardware.monitor import HardwareView
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.locks import FileLock

DRA_DRIVER = "gpu.iluvatar.com"  # the DRA driver's claims hold chips too, where a node moved from DRA
RESET_LOCK_FILE = "reset.lock"
LOCK_POLL = 0.05


class PodHolders:
    """The device plugin's ChipGuard: the node's reset turn, the served plan, and pod-resources.

    applied: returns once the reconcile loop serves a hardware view of at least that version; settle: seconds an
    Allocate answered just before a hold needs to show in pod-resources; lock_dir: where the node's reset lock is
    (None: this process alone resets); turn_timeout: how long the turn is waited for.
    """

    def __init__(
        self,
        pod_resources: PodResources,
        current: Current,
        applied: Callable[[int], Awaitable[None]],
        *,
        settle: float,
        lock_dir: Path | None,
        turn_timeout: float,
    ) -> None:
        self._pod_resources = pod_resources
        self._current = current
        self._applied = applied
        self._settle = settle
        self._lock_dir = lock_dir
        self._turn_timeout = turn_timeout
        self._in_turn = asyncio.Lock()
        self._whole_boards_served = False  # a plan of whole multi-chip boards was served since the start

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """The node's reset turn (OutputError when another pod keeps it past turn_timeout)."""
        async with self._in_turn:
            if self._lock_dir is None:
                yield
                return
            lock = FileLock(self._lock_dir / RESET_LOCK_FILE)
            await lock.take(self._turn_timeout, poll=LOCK_POLL, purpose="a GPU reset")
            try:
                yield
            finally:
                lock.release()

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
        return await self._pod_resources.chip_holder(uuid, inventory, DRA_DRIVER, split_only=self._split_only())

    def saw(self, state: State) -> None:
        """The reconcile loop serves state from now on (remembered: whether it served whole multi-chip boards)."""
        if not state.config.splitboard and any(len(board.chips) > 1 for board in state.inventory.boards):
            self._whole_boards_served = True

    def _split_only(self) -> bool:
        """True while every plan this process served split the boards (so a first chip's ID names that chip)."""
        self.saw(self._current.state)
        return not self._whole_boards_served
