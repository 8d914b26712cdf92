"""Who holds a chip in device plugin mode: the healer's guard, from the kubelet's pod-resources API.

A chip is free when no container holds a device it stands behind: its own, its board's (a whole board holds every
chip on it), or any time-sliced replica of either. While the healer resets it, nothing new lands on it: it is
Unhealthy in the served plan, and Allocate refuses Unhealthy devices (an Allocate answered just before it went out
is in pod-resources by the time the healer's settling time is over).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.plan import REPLICA_SEPARATOR, Plan
from ix_device_plugin.core.telemetry import PodRef, chip_pods
from ix_device_plugin.deviceplugin.state import Current
from ix_device_plugin.kubelet.podresources import PodResources, PodResourcesError


class PodHolders:
    """The healer's guard: who holds a chip, per pod-resources (None: free)."""

    def __init__(self, pod_resources: PodResources, current: Current) -> None:
        self._pod_resources = pod_resources
        self._current = current

    @contextlib.asynccontextmanager
    async def guard(self, uuid: str) -> AsyncIterator[str | None]:
        """Yield who holds the chip (None: free); a chip whose holders cannot be known counts as held."""
        yield await self.holder(uuid)

    async def holder(self, uuid: str) -> str | None:
        """The container holding the chip (`namespace/pod (container)`), why that is not known, or None when free."""
        state = self._current.state
        try:
            allocations = await self._pod_resources.read({state.plan.resource_name})
        except PodResourcesError as error:
            return f"no one can tell whether a container holds it: {error}"
        return holder_of(uuid, allocations, state.plan, state.inventory)


def holder_of(uuid: str, allocations: Mapping[str, PodRef], plan: Plan, inventory: Inventory) -> str | None:
    """Who, of the allocations (device ID -> container), holds the chip uuid; None when no one does.

    A device ID the plan does not know (the config changed since it was allocated) is read as what it names: a chip,
    or a board by its first chip's UUID.
    """
    ref = chip_pods(plan, allocations).get(uuid)
    boards = {board.uuid: board for board in inventory.boards}
    for device_id, held in sorted(allocations.items()):
        if ref is not None:
            break
        if device_id in plan.by_id:
            continue
        base = device_id.partition(REPLICA_SEPARATOR)[0]
        chips = {base} | ({chip.uuid for chip in boards[base].chips} if base in boards else set())
        ref = held if uuid in chips else None
    return None if ref is None else f"{ref.namespace}/{ref.pod} ({ref.container})"
