"""Who holds a chip on a DRA node: the healer's ChipGuard.

A chip is held by a prepared claim on it or its board (admin access too), read from the checkpoint under the claims'
lock, or by a device the device plugin gave a container before the node moved to DRA (pod-resources, any resource
name). The node's reset turn is shared by every pod of the agent in either mode (runtime/noderole.py). Nothing is to
wait for once a chip is reserved: every prepare, in any pod of the driver, reads the node-health record under the
claims' lock and refuses a reserved chip.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.dra.state import DraState
from ix_device_plugin.hardware.monitor import HardwareView
from ix_device_plugin.kubelet.podresources import PodResources


class ClaimGuard:
    """The DRA driver's ChipGuard."""

    def __init__(self, state: DraState, pod_resources: PodResources, inventory: Callable[[], Inventory]) -> None:
        self._state = state
        self._pod_resources = pod_resources
        self._inventory = inventory

    def turn(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The node's reset turn (OutputError past its deadline)."""
        return self._state.reset_turn()

    async def served(self, view: HardwareView) -> None:
        """Nothing to wait for: prepares read the reservation under the claims' lock."""

    async def holder(self, uuid: str) -> str | None:
        """The claim or container holding the chip, why that cannot be told, or None."""
        claim = await self._state.claim_holding(uuid)
        if claim is not None or self._pod_resources.socket_path is None:
            return claim  # pod-resources turned off: claims are all this driver can know of
        # the claims are the checkpoint's (above): pod-resources adds the device plugin's devices
        return await self._pod_resources.chip_holder(uuid, self._inventory(), DRIVER, claims=False)
