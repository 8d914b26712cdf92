"""Who holds a chip in device plugin mode: the healer's ChipGuard, from the kubelet's pod-resources API.

A chip is held when a container holds any device ID that stands for it under any resource name (core/holding.py):
the name served now, one served before a rename or a `renameByDefault` change, `.shared`, and devices of the DRA
driver's claims (a pod from before the node moved to the device plugin). A chip whose holders cannot be known is
held.

The node's reset turn is the one every pod of the agent on the node shares in either mode (runtime/noderole.py). A
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
from collections.abc import Awaitable, Callable

from ix_device_plugin.deviceplugin.state import Current, State
from ix_device_plugin.hardware.monitor import HardwareView
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.noderole import ResetTurn

DRA_DRIVER = "gpu.iluvatar.com"  # the DRA driver's claims hold chips too, where a node moved from DRA


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
        reset_turn: ResetTurn,
        turn_timeout: float,
    ) -> None:
        self._pod_resources = pod_resources
        self._current = current
        self._applied = applied
        self._settle = settle
        self._reset_turn = reset_turn
        self._turn_timeout = turn_timeout
        self._whole_boards_served = False  # a plan of whole multi-chip boards was served since the start

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
        return await self._pod_resources.chip_holder(uuid, inventory, DRA_DRIVER, split_only=self._split_only())

    def saw(self, state: State) -> None:
        """The reconcile loop serves state from now on (remembered: whether it served whole multi-chip boards)."""
        if not state.config.splitboard and any(len(board.chips) > 1 for board in state.inventory.boards):
            self._whole_boards_served = True

    def _split_only(self) -> bool:
        """True while every plan this process served split the boards (so a first chip's ID names that chip)."""
        self.saw(self._current.state)
        return not self._whole_boards_served
