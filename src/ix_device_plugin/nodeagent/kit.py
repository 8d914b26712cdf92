"""The node-agent kit: the node services both front ends run, composed in one place.

A new node service is added here, once, for both modes: built in `NodeAgent.__init__` (or a helper beside it),
its tasks returned by `tasks()` (every pod) or `acting_tasks()` (the pod acting for the node only), closed in
`close()`. What differs between the modes is plain values (`Mode`) and what only the front end knows
(`FrontEnd`): its chip guard, its health policy and switch, how it discovers again after a reset, the inventory it
serves and who holds each chip. Nothing is set on a collaborator after it is built.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ix_device_plugin.core.healing import Rules
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.deviceaccess.service import DeviceAccessReport
from ix_device_plugin.gpureset.purpose import reset_feature
from ix_device_plugin.gpureset.service import ResetService
from ix_device_plugin.hardware.monitor import HardwareMonitor, MonitorSettings
from ix_device_plugin.hardware.open import BackendFactory
from ix_device_plugin.hardware.view import HardwareView
from ix_device_plugin.hardware.worker import Hardware
from ix_device_plugin.healing.healer import ChipGuard
from ix_device_plugin.healing.record import RecordFile, record_path
from ix_device_plugin.healing.service import NodeHealing
from ix_device_plugin.healing.settings import HealingSettings
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.runtime.lazymetrics import Gated, Registry
from ix_device_plugin.runtime.noderole import NodeRole
from ix_device_plugin.runtime.probes import ProbeHandlers, ProbeServer, start_probes
from ix_device_plugin.runtime.service import TaskFactory, bounded
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.health import HealthPolicy
from ix_device_plugin.settings.options import NodeOptions

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.gpureset.sequence import GpuReset, ResetHandshake
    from ix_device_plugin.telemetry.collector import TelemetryCollector
    from ix_device_plugin.telemetry.sampler import Holders, TelemetrySampler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mode:
    """What a front end's mode fixes of the node agent: plain values.

    plugins_dir: the kubelet's plugins directory, where the node-health record lives (None: no record, and no
    role: this process is alone on the node); role_locks: the role's lock files, the node's first (none: no role,
    runtime/noderole.py NodeLocks); duty: what holding
    the role means, for its logs; writer: who writes the record; story: self-healing's story file; node_watched:
    the front end watches its Node already (healing.service); claims: telemetry names the claims holding a chip
    and every pod samples (DRA), else only the pod acting for the node samples and exports (device plugin).
    """

    node_name: str
    writer: str
    plugins_dir: Path | None
    role_locks: tuple[Path, ...]
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


Guard = TypeVar("Guard", bound=ChipGuard)


class FrontEnd(Protocol[Guard]):
    """What only the front end knows; the kit asks the first two once, while it is built."""

    def chip_guard(self, pod_resources: PodResources, monitor: HardwareMonitor, record: RecordFile | None) -> Guard:
        """Its chip guard: the node's reset turn and who holds a chip (healing.healer.ChipGuard)."""
        ...

    def chip_holders(self, pod_resources: PodResources, monitor: HardwareMonitor) -> Holders:
        """Who holds each chip, for telemetry's labels."""
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


class NodeAgent(Generic[Guard]):
    """The hardware monitor, the node-health record, the node's role, the GPU reset service with its turn,
    self-healing, telemetry and the probes of one front end.

    factory: the GPUs' backend (telemetry opens an instance of its own); api: the process's API server connection
    (None: no Events, no reset handshake).
    """

    def __init__(
        self,
        options: NodeOptions,
        mode: Mode,
        front: FrontEnd[Guard],
        metrics: NodeMetrics,
        factory: BackendFactory,
        api: ApiConnection | None,
    ) -> None:
        self._options = options
        self._api = api
        self._claims = mode.claims
        self._front = front
        self._metrics = metrics
        self._no_handshake_said: set[str] = set()  # the features said to reset without the handshake
        self._probes: ProbeServer | None = None
        self.probe_port: int | None = None
        self.hardware = Hardware(factory, options.call_timeout)
        self.monitor = HardwareMonitor(
            self.hardware, _monitor_settings(options), metrics.observe_xid, metrics.observe_health_poll,
            ignored=front.current_health_policy,
        )  # fmt: skip
        plugins_dir = mode.plugins_dir
        self.record = RecordFile(record_path(plugins_dir)) if plugins_dir is not None else None
        # One pod of either mode acts for the node while another may serve beside it (an update, a switch between
        # modes); without the plugins directory this process is alone.
        self.role = (
            NodeRole(mode.role_locks, mode.duty, held_through_stop=mode.held_through_stop) if mode.role_locks else None
        )
        self.pod_resources = PodResources(options.pod_resources_socket)
        self.telemetry, self.sampler = self._telemetry(mode, front, factory, metrics.registry)
        self.guard = front.chip_guard(self.pod_resources, self.monitor, self.record)
        # Every pod of the agent resets the node's GPUs in turn; the reset's machinery is built at its first use.
        self.gpu_reset = ResetService(self._built_reset, node_turn=self.guard.turn)
        self.healing = self._healing(mode, front, metrics.registry)
        self.device_access = DeviceAccessReport(options, api, self.healing.events, metrics.registry)

    def _built_reset(self) -> GpuReset:
        """The GPU reset service's machinery, loaded at the first reset (or the handshake's record) of the process."""
        from ix_device_plugin.gpureset.sequence import GpuReset, ResetSettings

        settings = ResetSettings.of(self._options)
        return GpuReset(
            self.hardware, self._reset_handshake, self._front.rediscover, self._metrics, settings,
            node_turn=self.guard.turn,
            quiet_others=self.paused,  # telemetry lets go of the GPU library during a reset
        )  # fmt: skip

    def _healing(self, mode: Mode, front: FrontEnd[Guard], registry: Registry) -> NodeHealing:
        """Self-healing, by the pod acting for the node, with the node-health record."""
        settings = HealingSettings(
            policy=front.current_health_policy, switch=front.self_healing_switch,
            story=mode.story,
            rules=mode.rules or Rules(), acting=lambda: self.acting, boot_id=mode.boot_id, writer=mode.writer,
            node_watched=mode.node_watched, config=lambda: front.config,
        )  # fmt: skip
        return NodeHealing(
            self.monitor, self.gpu_reset, self.guard, self._api, settings, registry=registry, record=self.record
        )

    def _telemetry(
        self, mode: Mode, front: FrontEnd[Guard], factory: BackendFactory, registry: Registry
    ) -> tuple[TelemetryCollector | None, TelemetrySampler | None]:
        """ix-exporter's GPU metrics with who holds each chip (none without --telemetry-interval)."""
        interval = self._options.telemetry_interval
        if interval is None:
            return None, None
        from ix_device_plugin.telemetry.collector import TelemetryCollector  # loaded only when it is on
        from ix_device_plugin.telemetry.sampler import TelemetrySampler

        collector = TelemetryCollector(mode.node_name, claims=mode.claims)
        # With the device plugin one pod per node exports them: the one acting for the node.
        registry.register(collector if mode.claims else Gated(collector, lambda: self.acting))
        sampler = TelemetrySampler(
            Hardware(factory, self._options.call_timeout),  # its own worker and backend: a hung read stays its own
            collector,
            interval,
            lambda: front.inventory,
            front.chip_holders(self.pod_resources, self.monitor),
        )
        return collector, sampler

    # ---- the node's role ------------------------------------------------------------------------

    @property
    def acting(self) -> bool:
        """True while this pod acts for the node (always without a role: then it is alone)."""
        return self.role is None or self.role.held

    def take_role_at_start(self) -> bool:
        """Take the node's role when no other pod holds it; whether this pod acts for the node (a lock file that
        cannot serve: standby, said)."""
        return self.role is None or self.role.take_at_start()

    def act(self, work: Callable[[], Awaitable[None]]) -> TaskFactory:
        """A task running work while this pod acts for the node (cancelled when it lets go)."""
        role = self.role
        return work if role is None else lambda: role.run(work)

    # ---- the hardware -----------------------------------------------------------------------------

    async def start_monitor(self, fail_on_init_error: bool, xids: bool = True) -> HardwareView:
        """Decide and show this node's device access, then start the hardware monitor (HardwareMonitor.start).

        Where the device nodes cannot be opened the agent stays up with 0 GPUs whatever fail_on_init_error says: it
        shows what is missing (label, Event, metric) instead of restarting, and the chart's privileged DaemonSet
        takes the node where that is allowed."""
        access = self.device_access.check()
        if access is not None and not access.usable:
            fail_on_init_error = False
        return await self.monitor.start(fail_on_init_error, xids=xids)

    def device_access_missing(self) -> str | None:
        """What this node's agent lacks to reach the GPU device nodes (start_monitor decided), None when nothing is
        or nothing was shown."""
        access = self.device_access.access
        return access.missing if access is not None and not access.usable else None

    # ---- tasks ----------------------------------------------------------------------------------

    def tasks(self) -> dict[str, TaskFactory]:
        """The node services' tasks every pod runs, by name."""
        tasks = {**self.healing.tasks(), **self.device_access.tasks()}
        if self.sampler is not None and self._claims:
            tasks["telemetry"] = self.sampler.run
        return tasks

    def acting_tasks(self) -> list[TaskFactory]:
        """The node services' work only the pod acting for the node does."""
        return [self.sampler.run] if self.sampler is not None and not self._claims else []

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """No telemetry pass while inside, and telemetry's hold on the GPU library released first (a GPU reset)."""
        if self.sampler is None:
            yield
            return
        async with self.sampler.paused():
            yield

    async def _reset_handshake(self) -> ResetHandshake | None:
        """The reset handshake with other IXML users on ix-gpu-reset-<node>; None without an API connection."""
        if self._api is None:
            feature = reset_feature()
            if feature not in self._no_handshake_said:
                log.warning(
                    "%s resets GPUs without API access (NODE_NAME and a service account or kubeconfig): "
                    "other IXML users such as ix-exporter are not asked to let go before a reset",
                    feature,
                )
                self._no_handshake_said.add(feature)
            return None
        from ix_device_plugin.gpureset.handshake import open_handshake

        return await open_handshake(self._api, self._api.node_name)

    # ---- probes and stopping --------------------------------------------------------------------

    async def start_probes(self, handlers: ProbeHandlers) -> None:
        """Serve /healthz, /readyz and /metrics on --health-address (probe_port: the port, once bound)."""
        started = await start_probes(self._options.health_address, handlers)
        if started is not None:
            self._probes, self.probe_port = started

    async def stop_probes(self, timeout: float) -> None:
        """Stop serving the probes (bounded)."""
        if self._probes is not None:
            await bounded("stopping the probe server", self._probes.stop(), timeout)
            self._probes = None

    async def close(self) -> None:
        """Last at a stop, once the front end's own work is over: the pod-resources channel, telemetry's backend and
        the GPU library closed (bounded), then the role let go, for the pod that follows to act for the node."""
        timeout = self._options.stop_timeout
        await bounded("closing the pod-resources channel", self.pod_resources.close(), timeout * 0.05)
        if self.sampler is not None:
            await self.sampler.close(timeout=timeout * 0.1)
        # Room for the XID waiter's last bounded wait (EVENT_WAIT_MS), which must end before IXML shuts down.
        await self.hardware.close(timeout=timeout * 0.4)
        if self.role is not None:
            self.role.release()


def _monitor_settings(options: NodeOptions) -> MonitorSettings:
    return MonitorSettings(
        health_interval=options.health_interval,
        rediscover_interval=options.rediscover_interval,
        dev_root=options.dev_root,
        health_stale_after=options.health_stale_after,
    )
