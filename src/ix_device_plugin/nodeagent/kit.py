"""The node-agent kit: the node services both front ends run, composed in one place, and their life.

A new node service is added here, once, for both modes: built in `NodeAgent.__init__`, its task returned by
`tasks()`, stopped by `stop()`. A front end calls the kit's verbs (start, tasks, stop, problem, and the few
questions below) and reaches into none of its parts. What differs between the modes is plain values (`Mode`) and
what only the front end knows (`FrontEnd`, nodeagent/frontend.py). Nothing is set on a collaborator after it is
built.

Which pod runs what, the same in both modes (one pod of the agent acts for the node: the one holding its role,
runtime/noderole.py; the other serves the kubelet beside it during an update or a switch between the modes):
- every pod: the hardware monitor (discovery, health polls, hot-plug), the node-health record read at start and
  followed, self-healing's task (which resets and heals only while its pod acts for the node), the Node's Events,
  the device-access report, the operator's return annotation (unless the front end's own watch of its Node brings
  it), the probes, and every reset a front end asks for in the node's reset turn;
- only the pod acting for the node (the `node-role` task, cancelled when the role is lost): listening for XIDs (a
  pod on standby learns them from the record), the node labels, the reset handshake's record
  (`ix-gpu-reset-<node>`: a reset: true left behind ended at start, and said again when handing the GPUs back
  failed), the GPU metrics (sampled and exported), and the front end's own node-wide duties (the device plugin's
  node files and Volcano announcements; the DRA driver's ResourceSlices and claims' device metadata).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Generic

from ix_device_plugin.core.healing import Rules
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.deviceaccess.service import DeviceAccessReport
from ix_device_plugin.gpureset.outcome import KILL_WAIT, RESET_STOP_WAIT
from ix_device_plugin.gpureset.purpose import reset_feature
from ix_device_plugin.gpureset.service import ResetService
from ix_device_plugin.hardware.monitor import HardwareMonitor, MonitorSettings
from ix_device_plugin.hardware.open import BackendFactory
from ix_device_plugin.hardware.view import HardwareView
from ix_device_plugin.hardware.worker import Hardware
from ix_device_plugin.healing.record import RecordFile, record_path
from ix_device_plugin.healing.service import NodeHealing
from ix_device_plugin.healing.settings import HealingSettings
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.nodeagent.frontend import FrontEnd, Guard, Mode, NodeMetrics, NodeParts
from ix_device_plugin.runtime.lazymetrics import Gated, Registry
from ix_device_plugin.runtime.noderole import NodeRole, reset_turn
from ix_device_plugin.runtime.probes import ProbeHandlers, ProbeServer, start_probes
from ix_device_plugin.runtime.service import TaskFactory, bounded
from ix_device_plugin.settings.health import HealthPolicy
from ix_device_plugin.settings.options import NodeOptions

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.gpureset.sequence import GpuReset, ResetHandshake
    from ix_device_plugin.nodelabels.service import NodeLabels
    from ix_device_plugin.telemetry.collector import TelemetryCollector
    from ix_device_plugin.telemetry.sampler import TelemetrySampler

log = logging.getLogger(__name__)

__all__ = ["Mode", "NodeAgent", "NodeParts"]

Duty = Callable[[], Awaitable[None]]  # work done while this pod acts for the node, until cancelled


class NodeAgent(Generic[Guard]):
    """The hardware monitor, the node-health record, the node's role and its reset turn, the GPU reset service,
    self-healing, the node labels, telemetry and the probes of one front end.

    factory: the GPUs' backend (telemetry opens an instance of its own); api: the process's API server connection
    (None: no Events, no reset handshake); the kit closes it at stop.
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
        self.monitor.subscribe(front.hardware_changed)  # the one subscriber: the front end hands each view on
        plugins_dir = mode.plugins_dir
        self.record = RecordFile(record_path(plugins_dir)) if plugins_dir is not None else None
        # One pod of either mode acts for the node while another may serve beside it (an update, a switch between
        # modes); without the plugins directory this process is alone. The role's lock files and the reset turn's
        # are the node's (NodeLocks), named in one place.
        locks = mode.locks
        self.role = NodeRole(locks.role, mode.duty, held_through_stop=mode.held_through_stop) if locks else None
        timeout = options.reset_wait_timeout
        self.reset_turn = locks.reset_turn(timeout) if locks is not None else reset_turn((), timeout)
        self.pod_resources = PodResources(options.pod_resources_socket)
        parts = NodeParts(self.pod_resources, self.monitor, self.record, self.reset_turn)
        self.labels = self._labels(options)
        self.telemetry, self.sampler = self._telemetry(mode, front, factory, metrics.registry, parts)
        self.guard = front.chip_guard(parts)
        # Every pod of the agent resets the node's GPUs in turn; the reset's machinery is built at its first use.
        self.gpu_reset = ResetService(self._built_reset, node_turn=self.reset_turn.held)
        self.healing = self._healing(mode, front, metrics.registry)
        self.device_access = DeviceAccessReport(options, api, self.healing.events, metrics.registry)

    def _built_reset(self) -> GpuReset:
        """The GPU reset service's machinery, loaded at the first reset (or the handshake's record) of the process."""
        from ix_device_plugin.gpureset.sequence import GpuReset, ResetSettings

        settings = ResetSettings.of(self._options)
        return GpuReset(
            self.hardware, self._reset_handshake, self._front.rediscover, self._metrics, settings,
            node_turn=self.reset_turn.held,
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

    @staticmethod
    def _labels(options: NodeOptions) -> NodeLabels | None:
        """The node labels' NFD feature file (none without --node-feature-dir)."""
        if options.node_feature_dir is None:
            return None
        from ix_device_plugin.nodelabels.service import NodeLabels  # loaded only when the feature file is on

        return NodeLabels(options.node_feature_dir, options.sysfs_root)

    def _telemetry(
        self, mode: Mode, front: FrontEnd[Guard], factory: BackendFactory, registry: Registry, parts: NodeParts
    ) -> tuple[TelemetryCollector | None, TelemetrySampler | None]:
        """ix-exporter's GPU metrics with who holds each chip (none without --telemetry-interval), exported by the
        pod acting for the node."""
        interval = self._options.telemetry_interval
        if interval is None:
            return None, None
        from ix_device_plugin.telemetry.collector import TelemetryCollector  # loaded only when it is on
        from ix_device_plugin.telemetry.sampler import TelemetrySampler

        collector = TelemetryCollector(mode.node_name, claims=mode.claims)
        registry.register(Gated(collector, lambda: self.acting))
        sampler = TelemetrySampler(
            Hardware(factory, self._options.call_timeout),  # its own worker and backend: a hung read stays its own
            collector,
            interval,
            lambda: front.inventory,
            front.chip_holders(parts),
        )
        return collector, sampler

    # ---- starting -------------------------------------------------------------------------------

    async def start(self, fail_on_init_error: bool, policy: HealthPolicy | None = None) -> bool:
        """Take the node's role when no other pod holds it, restore what the node-health record says (before the
        first discovery: a chip out of service is so from the start; policy: the health policy the start reads),
        then decide and show this node's device access and start the hardware monitor, listening for XIDs when
        acting (a pod on standby learns them from the record). Whether this pod acts for the node.

        Where the device nodes cannot be opened the agent stays up with 0 GPUs whatever fail_on_init_error says: it
        shows what is missing (label, Event, metric) instead of restarting, and the chart's privileged DaemonSet
        takes the node where that is allowed."""
        acting = self.role is None or self.role.take_at_start()  # a lock file that cannot serve: standby, said
        self.healing.restore(policy)
        access = self.device_access.check()
        if access is not None and not access.usable:
            fail_on_init_error = False
        await self.monitor.start(fail_on_init_error, xids=acting)
        return acting

    async def start_probes(self, handlers: ProbeHandlers) -> None:
        """Serve /healthz, /readyz and /metrics on --health-address (probe_port: the port, once bound)."""
        started = await start_probes(self._options.health_address, handlers)
        if started is not None:
            self._probes, self.probe_port = started

    # ---- what the front ends ask ----------------------------------------------------------------

    @property
    def acting(self) -> bool:
        """True while this pod acts for the node (always without a role: then it is alone)."""
        return self.role is None or self.role.held

    @property
    def role_problem(self) -> str:
        """Why the role's lock file cannot serve as one ("" when it can, or when there is no role)."""
        return self.role.unusable if self.role is not None else ""

    @property
    def view(self) -> HardwareView:
        """The hardware as the monitor sees it now."""
        return self.monitor.view

    @property
    def inventory(self) -> Inventory:
        """The chips as the monitor sees them now."""
        return self.monitor.inventory

    async def rediscover(self) -> HardwareView:
        """Discover again now (after a GPU reset); the view found (BackendError when the hardware cannot answer)."""
        return await self.monitor.rediscover()

    def problem(self) -> str | None:
        """What keeps the node's hardware from being watched, for liveness; None when nothing does."""
        return self.monitor.problem()

    def device_access_missing(self) -> str | None:
        """What this node's agent lacks to reach the GPU device nodes (start decided), None when nothing is or
        nothing was shown."""
        access = self.device_access.access
        return access.missing if access is not None and not access.usable else None

    def reserved(self) -> dict[str, str]:
        """Chips reserved for a reset by any pod of the agent (chip UUID -> why): the node-health record, read now
        (the last good one this pod read while it is gone or spoiled, until the acting pod writes it again)."""
        return {} if self.record is None else self.record.reserved_now()

    async def reset(self, chips: tuple[str, ...]) -> None:
        """Reset these chips in the node's reset turn and discover again (GpuResetError when that failed)."""
        await self.gpu_reset.reset(chips)

    def chips_freed(self) -> None:
        """A chip may be free now (a claim unprepared): self-healing looks again at once."""
        self.healing.wake()

    def settings_changed(self) -> None:
        """The configuration changed: self-healing turned on resets the chips it left out, at once."""
        self.healing.settings_changed()

    @property
    def follows_returns(self) -> bool:
        """True when the operator's return annotation is followed (API access): a front end that watches its Node
        hands each value to return_seen."""
        return self.healing.follows_returns

    def return_seen(self, value: str) -> None:
        """The operator's return annotation `iluvatar.com/gpu.return`, as the front end's watch of its Node read it."""
        self.healing.return_seen(value)

    def labels_changed(self) -> None:
        """What the front end serves changed: the node labels follow, written by the pod acting for the node."""
        if self.labels is not None and self.acting:
            self.labels.want(self._front.node_labels(self.labels.machine))

    # ---- tasks ----------------------------------------------------------------------------------

    def tasks(self, duties: Mapping[str, Duty] | None = None, *, before: Duty | None = None) -> dict[str, TaskFactory]:
        """Every node task, by name: those every pod runs, and `node-role` (`node` without a role): while this pod
        acts for the node, once before() is done, XIDs heard, then the node's duties and the front end's (duties,
        each until cancelled)."""
        tasks: dict[str, TaskFactory] = {"hardware": self.monitor.run, **self.healing.tasks()}
        tasks.update(self.device_access.tasks())
        acting = self._acting_work(dict(duties or {}), before)
        tasks["node" if self.role is None else "node-role"] = acting if self.role is None else self._in_role(acting)
        return tasks

    def _in_role(self, work: Duty) -> TaskFactory:
        role = self.role
        assert role is not None
        return lambda: role.run(work)

    def _acting_work(self, duties: dict[str, Duty], before: Duty | None) -> Duty:
        if self.labels is not None:
            duties["node-labels"] = self._keep_labels
        if self._api is not None:
            duties["reset-record"] = self._keep_reset_record
        if self.sampler is not None:
            duties["telemetry"] = self.sampler.run

        async def act() -> None:
            if before is not None:
                await before()
            await self.monitor.watch_xids()
            async with asyncio.TaskGroup() as group:
                for name, duty in duties.items():
                    group.create_task(duty(), name=name)
                group.create_task(asyncio.Event().wait())  # until cancelled, even with nothing to run

        return act

    async def _keep_labels(self) -> None:
        """Write the node labels for what the front end serves, and again whenever another agent hands the file
        over; until cancelled."""
        assert self.labels is not None
        self.labels_changed()
        await self.labels.run()

    async def _keep_reset_record(self) -> None:
        """Keep the reset handshake's ConfigMap in order (GpuReset.keep_record); until cancelled."""
        assert self._api is not None
        await self.gpu_reset.keep_record(self._api.backoff(), announce=self._front.announces_reset)

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

    # ---- stopping -------------------------------------------------------------------------------

    async def stop(self, budget: float) -> None:
        """Once the front end's tasks and servers have stopped, within about budget seconds: a GPU reset under way
        ended (RESET_STOP_WAIT, then its ixsmi killed) before reset: false is said, the Events still pending
        written, the API connection and the probes closed, the node labels handed over, the pod-resources channel,
        telemetry's backend and the GPU library closed; then the role let go, for the pod that follows to act for
        the node."""
        ending = budget * 0.25 + (RESET_STOP_WAIT + KILL_WAIT if self.gpu_reset.command_running else 0)
        await bounded("ending the GPU reset", self.gpu_reset.close(timeout=budget * 0.2), ending)
        await self.healing.close(timeout=budget * 0.1)
        if self._api is not None:
            await bounded("closing the API connection", self._api.close(), budget * 0.05)
        if self._probes is not None:
            await bounded("stopping the probe server", self._probes.stop(), budget * 0.1)
            self._probes = None
        if self.labels is not None:
            self.labels.close()
        await bounded("closing the pod-resources channel", self.pod_resources.close(), budget * 0.05)
        if self.sampler is not None:
            await self.sampler.close(timeout=budget * 0.1)
        # Room for the XID waiter's last bounded wait (EVENT_WAIT_MS), which must end before IXML shuts down.
        await self.hardware.close(timeout=budget * 0.4)
        if self.role is not None:
            self.role.release()


def _monitor_settings(options: NodeOptions) -> MonitorSettings:
    return MonitorSettings(
        health_interval=options.health_interval,
        rediscover_interval=options.rediscover_interval,
        dev_root=options.dev_root,
        health_stale_after=options.health_stale_after,
    )
