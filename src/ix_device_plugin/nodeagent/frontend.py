"""What a front end hands the node-agent kit, and what the kit hands back.

Its mode's plain values (`Mode`), its metrics, and itself (`FrontEnd`: what only it knows), answered with the node's
parts its chip guard is built from (`NodeParts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ix_device_plugin.core.healing import Rules
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.hardware.monitor import HardwareMonitor
from ix_device_plugin.hardware.view import HardwareView
from ix_device_plugin.healing.healer import ChipGuard
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.runtime.lazymetrics import Registry
from ix_device_plugin.runtime.locks import TurnLock
from ix_device_plugin.runtime.noderole import NodeLocks
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.health import HealthPolicy

if TYPE_CHECKING:
    from ix_device_plugin.core.labels import LabelSet
    from ix_device_plugin.telemetry.sampler import Holders


@dataclass(frozen=True)
class Mode:
    """What a front end's mode fixes of the node agent: plain values.

    plugins_dir: the kubelet's plugins directory, where the node-health record lives (None: no record, and no
    role: this process is alone on the node); locks: the lock files of the node's role and of its reset turn
    (None: no role, and a reset turn of this process alone; runtime/noderole.py NodeLocks); duty: what holding the
    role means, for its logs; writer: who writes the record; story: self-healing's story file; node_watched: the
    front end watches its Node already (healing.service); claims: telemetry names the claims holding each chip.
    """

    node_name: str
    writer: str
    plugins_dir: Path | None
    locks: NodeLocks | None
    duty: str
    story: Path | None
    boot_id: str
    rules: Rules | None = None
    held_through_stop: bool = False
    node_watched: bool = False
    claims: bool = False


class NodeMetrics(Protocol):
    """A front end's metrics, as the kit uses them: its registry, the reset's counter and histogram, and what the
    hardware monitor reports."""

    registry: Registry
    gpu_resets: Any
    gpu_reset_duration: Any

    def observe_xid(self, xid: int) -> None:
        """One critical XID event."""
        ...

    def observe_health_poll(self) -> None:
        """A successful health poll."""
        ...


@dataclass(frozen=True)
class NodeParts:
    """The node's parts a front end builds its chip guard and its telemetry holders from: the kubelet's
    pod-resources, the hardware monitor, the node-health record (None without one) and the node's reset turn."""

    pod_resources: PodResources
    monitor: HardwareMonitor
    record: RecordFile | None
    reset_turn: TurnLock


Guard = TypeVar("Guard", bound=ChipGuard)


class FrontEnd(Protocol[Guard]):
    """What only the front end knows; the kit asks the first two once, while it is built."""

    def chip_guard(self, parts: NodeParts) -> Guard:
        """Its chip guard: the node's reset turn and who holds a chip (healing.healer.ChipGuard)."""
        ...

    def chip_holders(self, parts: NodeParts) -> Holders:
        """Who holds each chip, for telemetry's labels."""
        ...

    def hardware_changed(self, view: HardwareView) -> None:
        """A new view of the hardware (the monitor's only subscriber: the front end hands it on itself)."""
        ...

    def node_labels(self, machine: str | None) -> LabelSet:
        """The node's labels for what it serves now (machine: the DMI product name)."""
        ...

    def announces_reset(self) -> bool:
        """Whether the reset handshake's ConfigMap says at start that this agent holds the GPUs (a feature resets
        at any time), rather than only ending a reset: true left behind."""
        ...

    @property
    def inventory(self) -> Inventory:
        """The inventory it serves now."""
        ...

    def current_health_policy(self) -> HealthPolicy:
        """The health policy in force: the XIDs the monitor ignores, the ones self-healing acts on."""
        ...

    def self_healing_switch(self) -> str:
        """selfHealing as configured now."""
        ...

    @property
    def config(self) -> Config:
        """The configuration in force (self-healing reads its reset diagnostic there)."""
        ...

    async def rediscover(self) -> Inventory:
        """Discover again after a GPU reset; the inventory once it is served."""
        ...
