"""What the node agent's services read of a DRA node, from the slice content the driver serves.

The node's labels (the device plugin's and the DRA driver's own), who holds each chip for telemetry, and the
node-state gauges the dashboard reads in both modes (nodeagent/kit.py runs them).
"""

from __future__ import annotations

from collections.abc import Callable

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.labels import LabelSet, dra_labels, label_set
from ix_device_plugin.core.plan import Plan, plan
from ix_device_plugin.dra.metrics import DraMetrics
from ix_device_plugin.dra.registration import RegistrationService
from ix_device_plugin.dra.slices import CHIP, DRIVER, SliceContent
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.runtime.lazymetrics import Gated
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.options import DraOptions
from ix_device_plugin.telemetry.holders import ClaimHolders
from ix_device_plugin.telemetry.nodestate import Devices, NodeStateCollector


def dra_label_set(inventory: Inventory, config: Config, content: SliceContent, machine: str | None) -> LabelSet:
    """The node's labels on a DRA node: the device plugin's, for the node planned as it would plan it under the
    same ix-config (so a node moved between the two keeps their values), and the DRA driver's own."""
    common = label_set(inventory, plan(inventory, config), config, machine, inventory.cuda_version)
    if not common.labels:
        return common  # no chips, no labels: as the device plugin does
    chips = sum(1 for device in content.devices if device.kind == CHIP)
    boards = sum(1 for device in content.devices if device.whole_board)
    shares = content.policy.replicas if content.policy.shared else 0
    return LabelSet({**common.labels, **dra_labels(DRIVER, chips, boards, shares)}, common.notes)


def claim_holders(
    pod_resources: PodResources,
    options: DraOptions,
    content: Callable[[], SliceContent],
    inventory: Callable[[], Inventory],
) -> ClaimHolders:
    """Who holds each chip for telemetry: the claims prepared on it, and the pods the device plugin gave its device
    IDs to before the node moved to DRA (the node as the device plugin plans it under the same ix-config)."""

    def device_chips() -> dict[str, tuple[str, ...]]:
        return {device.name: tuple(chip.uuid for chip in device.chips) for device in content().devices}

    def node_plan() -> Plan:
        return plan(inventory(), options.config)

    return ClaimHolders(pod_resources, DRIVER, options.node_name, device_chips, node_plan)


class DraNodeGauges:
    """The node-state gauges the dashboard reads in both modes, for the devices the driver serves, exported by the pod
    acting for the node (as in device plugin mode: the dashboard counts each node once).

    metrics: the driver's (the gauges join its registry); registration: the kubelet's registration of the driver.
    """

    def __init__(
        self,
        monitor_inventory: Callable[[], Inventory],
        content: Callable[[], SliceContent],
        metrics: DraMetrics,
        registration: RegistrationService,
        acting: Callable[[], bool],
    ) -> None:
        self._content = content
        registered = registration.registered.is_set
        gauges = NodeStateCollector(self._devices, monitor_inventory, registered)
        metrics.registry.register(Gated(gauges, acting))

    def _devices(self) -> Devices:
        devices = self._content().devices
        return Devices(DRIVER, len(devices), sum(1 for device in devices if device.healthy))
