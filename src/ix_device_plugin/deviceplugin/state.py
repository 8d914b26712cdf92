"""The one reference to what is served now: inventory, last valid config and the plan made of them.

Only the reconcile loop (daemon.py) calls `Current.swap`; everything else reads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.plan import Plan, plan
from ix_device_plugin.settings.config import Config

DeviceView = tuple[str, tuple[tuple[str, bool, tuple[int, ...]], ...]]


@dataclass(frozen=True)
class State:
    """Everything an output needs, immutable and swapped whole."""

    inventory: Inventory
    config: Config
    plan: Plan

    @classmethod
    def of(cls, inventory: Inventory, config: Config) -> State:
        """The state for inventory under config."""
        return cls(inventory, config, plan(inventory, config))


def device_view(p: Plan) -> DeviceView:
    """What ListAndWatch tells the kubelet: resource name, and each device's ID, health and NUMA nodes."""
    return p.resource_name, tuple((d.id, d.healthy, d.numa_nodes) for d in p.devices)


class Current:
    """Holds the served State; `news` is set whenever the device view changes."""

    def __init__(self, state: State) -> None:
        self._state = state
        self._view = device_view(state.plan)
        self._view_generation = 0
        self._news = asyncio.Event()

    @property
    def state(self) -> State:
        """The state served now."""
        return self._state

    @property
    def plan(self) -> Plan:
        """The plan served now."""
        return self._state.plan

    @property
    def view_generation(self) -> int:
        """Bumped each time the device view changes."""
        return self._view_generation

    @property
    def news(self) -> asyncio.Event:
        """An event set at the next change of the device view."""
        return self._news

    def swap(self, state: State) -> bool:
        """Serve state from now on; True (and streams woken) when the device view changed."""
        self._state = state
        view = device_view(state.plan)
        if view == self._view:
            return False
        self._view = view
        self._view_generation += 1
        woken, self._news = self._news, asyncio.Event()
        woken.set()
        return True


async def first_set(*events: asyncio.Event) -> None:
    """Return when any of events is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
