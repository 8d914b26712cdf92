"""The node services on a DRA node: the node's labels, kept as the device plugin keeps them and with the DRA
driver's own, fed by the hardware monitor and the slice content the driver serves."""

from __future__ import annotations

from collections.abc import Callable

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.labels import LabelSet, dra_labels, label_set
from ix_device_plugin.core.plan import plan
from ix_device_plugin.dra.slices import CHIP, DRIVER, SliceContent
from ix_device_plugin.hardware.monitor import HardwareMonitor, HardwareView
from ix_device_plugin.nodelabels.service import NodeLabels
from ix_device_plugin.runtime.service import TaskFactory
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.options import DraOptions


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


class DraNodeServices:
    """What the DRA driver does for the node beside serving claims: its labels (the NFD feature file)."""

    def __init__(self, options: DraOptions, monitor: HardwareMonitor, content: Callable[[], SliceContent]) -> None:
        base = options.base
        self._config = options.config
        self._monitor = monitor
        self._content = content
        self.labels = NodeLabels(base.node_feature_dir, base.sysfs_root) if base.node_feature_dir else None
        monitor.subscribe(self._hardware_changed)  # after the driver's own subscription: the content is new

    def tasks(self) -> dict[str, TaskFactory]:
        """The background tasks to supervise, by name."""
        return {"node-labels": self._keep_labels} if self.labels is not None else {}

    def changed(self) -> None:
        """Write the labels for what the node has and the driver serves now."""
        if self.labels is not None:
            inventory = self._monitor.inventory
            self.labels.want(dra_label_set(inventory, self._config, self._content(), self.labels.machine))

    def close(self) -> None:
        """At a clean stop: as the node-labels service does it."""
        if self.labels is not None:
            self.labels.close()

    def _hardware_changed(self, view: HardwareView) -> None:
        self.changed()

    async def _keep_labels(self) -> None:
        assert self.labels is not None
        self.changed()
        await self.labels.run()
