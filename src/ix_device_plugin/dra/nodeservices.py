"""The node services on a DRA node, fed by the hardware monitor and the slice content the driver serves: the
node's labels (the device plugin's and the DRA driver's own), ix-exporter's GPU metrics with the pods and
claims holding each chip, and the node-state gauges the dashboard reads in both modes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.labels import LabelSet, dra_labels, label_set
from ix_device_plugin.core.plan import Plan, plan
from ix_device_plugin.dra.slices import CHIP, DRIVER, SliceContent
from ix_device_plugin.hardware.monitor import HardwareMonitor, HardwareView
from ix_device_plugin.hardware.open import BackendFactory
from ix_device_plugin.hardware.worker import Hardware
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.nodelabels.service import NodeLabels
from ix_device_plugin.runtime.lazymetrics import Registry
from ix_device_plugin.runtime.service import TaskFactory, bounded
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.options import DraOptions
from ix_device_plugin.telemetry.collector import TelemetryCollector
from ix_device_plugin.telemetry.holders import ClaimHolders
from ix_device_plugin.telemetry.nodestate import Devices, NodeStateCollector
from ix_device_plugin.telemetry.sampler import TelemetrySampler


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
    """What the DRA driver does for the node beside serving claims: its labels and its GPU metrics.

    factory: the GPUs' backend, of which telemetry opens an instance of its own; registry: the driver's metrics;
    registered: whether the kubelet has registered the driver.
    """

    def __init__(
        self,
        options: DraOptions,
        monitor: HardwareMonitor,
        content: Callable[[], SliceContent],
        factory: BackendFactory,
        registry: Registry,
        registered: Callable[[], bool],
    ) -> None:
        base = options.base
        self._config = options.config
        self._monitor = monitor
        self._content = content
        self._stop_timeout = base.stop_timeout
        self.labels = NodeLabels(base.node_feature_dir, base.sysfs_root) if base.node_feature_dir else None
        self.pod_resources = PodResources(base.pod_resources_socket)
        self.telemetry: TelemetryCollector | None = None
        self.sampler: TelemetrySampler | None = None
        if base.telemetry_interval is not None:
            self.telemetry = TelemetryCollector(options.node_name, claims=True)
            registry.register(self.telemetry)
            holders = ClaimHolders(self.pod_resources, DRIVER, options.node_name, self._device_chips, self._plan)
            self.sampler = TelemetrySampler(
                Hardware(factory, base.call_timeout),  # its own worker and backend: a hung read stays its own
                self.telemetry,
                base.telemetry_interval,
                lambda: monitor.inventory,
                holders,
            )
        registry.register(NodeStateCollector(self._devices, lambda: monitor.inventory, registered))
        monitor.subscribe(self._hardware_changed)  # after the driver's own subscription: the content is new

    def tasks(self) -> dict[str, TaskFactory]:
        """The background tasks to supervise, by name."""
        tasks: dict[str, TaskFactory] = {}
        if self.labels is not None:
            tasks["node-labels"] = self._keep_labels
        if self.sampler is not None:
            tasks["telemetry"] = self.sampler.run
        return tasks

    def changed(self) -> None:
        """Write the labels for what the node has and the driver serves now."""
        if self.labels is not None:
            inventory = self._monitor.inventory
            self.labels.want(dra_label_set(inventory, self._config, self._content(), self.labels.machine))

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """No telemetry pass while inside, and telemetry's hold on the GPU library released first (a GPU reset)."""
        if self.sampler is None:
            yield
            return
        async with self.sampler.paused():
            yield

    async def close(self) -> None:
        """At a clean stop: the labels as the node-labels service leaves them, the pod-resources channel and
        telemetry's backend closed (bounded)."""
        if self.labels is not None:
            self.labels.close()
        timeout = self._stop_timeout
        await bounded("closing the pod-resources channel", self.pod_resources.close(), timeout * 0.05)
        if self.sampler is not None:
            await self.sampler.close(timeout=timeout * 0.1)

    def _hardware_changed(self, view: HardwareView) -> None:
        self.changed()

    async def _keep_labels(self) -> None:
        assert self.labels is not None
        self.changed()
        await self.labels.run()

    def _device_chips(self) -> dict[str, tuple[str, ...]]:
        return {device.name: tuple(chip.uuid for chip in device.chips) for device in self._content().devices}

    def _plan(self) -> Plan:
        """The node as the device plugin plans it (its device IDs held by pods from before the move to DRA)."""
        return plan(self._monitor.inventory, self._config)

    def _devices(self) -> Devices:
        devices = self._content().devices
        return Devices(DRIVER, len(devices), sum(1 for device in devices if device.healthy))
