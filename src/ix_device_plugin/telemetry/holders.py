"""Who holds each chip, asked of the kubelet's pod-resources API once per telemetry pass.

On a device-plugin node through the plugin's device IDs, on a DRA node through the devices of the containers'
ResourceClaims.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from ix_device_plugin.core.plan import Plan
from ix_device_plugin.core.telemetry import ChipHolders, claim_holders, plugin_holders
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)


class PluginHolders:
    """The device plugin's: the container holding each chip, from the devices of its resource (one per chip)."""

    def __init__(self, pod_resources: PodResources, plan: Callable[[], Plan]) -> None:
        self._pod_resources = pod_resources
        self._plan = plan
        self._errors = OncePerError(log, logging.WARNING)

    async def __call__(self) -> ChipHolders:
        """Chip UUID -> the container holding it (empty when the kubelet cannot say)."""
        allocations = await self._pod_resources.allocations({self._plan().resource_name}, self._errors)
        return plugin_holders(self._plan(), allocations)


class ClaimHolders:
    """The DRA driver's: every container holding each chip through a claim of driver in pool (device_chips: each
    published device's chips), or through a device the device plugin gave it before the node moved to DRA
    (plugin_plan: the node as the plugin plans it)."""

    def __init__(
        self,
        pod_resources: PodResources,
        driver: str,
        pool: str,
        device_chips: Callable[[], Mapping[str, Sequence[str]]],
        plugin_plan: Callable[[], Plan],
    ) -> None:
        self._pod_resources = pod_resources
        self._driver = driver
        self._pool = pool
        self._device_chips = device_chips
        self._plugin_plan = plugin_plan
        self._errors = OncePerError(log, logging.WARNING)

    async def __call__(self) -> ChipHolders:
        """Chip UUID -> the containers holding it (empty when the kubelet cannot say)."""
        holdings = await self._pod_resources.holdings(self._errors)
        return claim_holders(holdings, self._driver, self._pool, self._device_chips(), self._plugin_plan())
