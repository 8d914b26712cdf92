"""The device plugin's reconcile loop: the one writer of the served State; every other task only sends it events.

Inputs (each only turns a happening into an event on one queue):
- the hardware monitor: each new view of the chips (discovery, health polls, XID events, hot-plug);
- the file watcher: the socket directory and the config's directory, woken by inotify and a timer;
- the node label (with --per-node-config) and SIGHUP, which re-read the configuration.
The loop takes one event at a time, computes the desired State (inventory, last valid config, their plan)
and applies it: `Current.swap` is the one place where what is served changes. Outputs read that State: the
endpoint (gRPC service), the registrar, the node files, the probes and the metrics.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ix_device_plugin.api import api_pb2
from ix_device_plugin.core.healing import Rules
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.limits import device_list_problem
from ix_device_plugin.core.plan import Plan
from ix_device_plugin.deviceplugin.agentmode import api_connection, plugin_mode
from ix_device_plugin.deviceplugin.changes import config_diff, log_plan, log_transitions
from ix_device_plugin.deviceplugin.chipguard import PodHolders, WholeBoardsMark
from ix_device_plugin.deviceplugin.configsource import ConfigSource
from ix_device_plugin.deviceplugin.endpoint import Endpoint, plugin_socket
from ix_device_plugin.deviceplugin.events import (
    Event,
    FilesChanged,
    HardwareChanged,
    NodeLabelChanged,
    ReloadRequested,
    RoleChanged,
)
from ix_device_plugin.deviceplugin.features.hook import ApiFeatures
from ix_device_plugin.deviceplugin.handover import (
    HANDOVER_SETTLE,
    fixed_name_served,
    refuse_reserved,
    registration_beside,
    until_fixed_name_free,
)
from ix_device_plugin.deviceplugin.metrics import Metrics
from ix_device_plugin.deviceplugin.nodefiles import NodeFiles
from ix_device_plugin.deviceplugin.registrar import Registrar
from ix_device_plugin.deviceplugin.state import Current, State
from ix_device_plugin.gpureset.outcome import GpuResetError
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.monitor import HardwareView
from ix_device_plugin.hardware.open import BackendFactory
from ix_device_plugin.hardware.open import backend_factory as open_backend
from ix_device_plugin.healing.operatorreturn import return_annotation
from ix_device_plugin.nodeagent.kit import NodeAgent, NodeParts
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.filewatch import Watcher
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.runtime.probes import ProbeHandlers
from ix_device_plugin.runtime.service import Service, bounded
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.health import HealthPolicy
from ix_device_plugin.settings.options import Options

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.nodelabel import AlsoFollowed
    from ix_device_plugin.apiserver.settings import KubeSettings
    from ix_device_plugin.core.labels import LabelSet
    from ix_device_plugin.telemetry.holders import PluginHolders

log = logging.getLogger(__name__)
Guard = PodHolders  # the device plugin's chip guard


class Daemon:
    """One plugin instance: serves the Current state, keeps it registered and true.

    kube: how to reach the API server, for the features that use it (None: they go without);
    backend_factory: the GPUs' backend (default: the one options name); healing_rules: how hard self-healing tries.
    """

    def __init__(
        self,
        options: Options,
        metrics: Metrics | None = None,
        *,
        kube: KubeSettings | None = None,
        backend_factory: BackendFactory | None = None,
        healing_rules: Rules | None = None,
    ) -> None:
        self.options = options
        self.kube_settings = kube
        self.metrics = metrics or Metrics()
        self.service = Service(options.stop_timeout)
        self.current = Current(State.of(Inventory(), Config()))
        self.apiserver = api_connection(kube)  # the one connection to the API server, made on first use
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._applied_version = 0  # the last hardware view the loop has taken
        self._applied = asyncio.Event()
        self._settle = (healing_rules or Rules()).settle
        factory, mode = backend_factory or open_backend(options), plugin_mode(options, healing_rules)
        self.node: NodeAgent[PodHolders] = NodeAgent(options, mode, self, self.metrics, factory, self.apiserver)
        self.api = ApiFeatures(
            self.current, self.node.gpu_reset, self._pod_devices, self.apiserver,
            acting=lambda: self.node.acting, volcano_field_manager=options.volcano_field_manager,
        )  # fmt: skip
        socket = plugin_socket(options.plugin_dir, options.pod_uid)
        self.endpoint = Endpoint(socket, self.current, self.metrics.observe_call, self._before_allocate)
        self.registrar = Registrar(options.plugin_dir, socket.name, lambda: self.plan.resource_name, self.metrics,
                                   options.poll_interval, followed=self.endpoint.followed_since)  # fmt: skip
        self.metrics.read_state_from(lambda: self.current.state, lambda: self.registrar.registered, lambda: self.acting)
        self.metrics.read_role_from(lambda: self.acting)
        self.config_source = ConfigSource(options, self.apiserver)
        self.files = NodeFiles(options.cdi_spec_dir, options.dev_root)
        self.socket_path = self.endpoint.path
        self._endpoint_errors, self._limit_errors = OncePerError(log), OncePerError(log)
        self._volcano_pod_errors = OncePerError(log, logging.WARNING)
        self.serving_wanted = True  # False while waiting on standby for the pod serving the node to stop
        self._waiting_why = ""

    # ---- what the node agent asks of the device plugin (nodeagent.kit.FrontEnd) ------------------

    def chip_guard(self, parts: NodeParts) -> Guard:
        """The device plugin's chip guard: the served plan, pod-resources, and the node's reset turn (kept: the
        reconcile loop tells it each State it serves, and the Volcano feature asks pod-resources through it)."""
        self._pod_resources = parts.pod_resources
        self._holders = PodHolders(
            parts.pod_resources, self.current, self._until_applied, settle=self._settle, reset_turn=parts.reset_turn,
            turn_timeout=self.options.reset_wait_timeout, whole_boards=WholeBoardsMark.beside(parts.record),
        )  # fmt: skip
        return self._holders

    def chip_holders(self, parts: NodeParts) -> PluginHolders:
        """Who holds each chip, by the device IDs of the plan served."""
        from ix_device_plugin.telemetry.holders import PluginHolders  # loaded only when telemetry is on

        return PluginHolders(parts.pod_resources, lambda: self.plan)

    def hardware_changed(self, view: HardwareView) -> None:
        """A new view of the hardware: an event for the reconcile loop."""
        self._events.put_nowait(HardwareChanged(view))

    def node_labels(self, machine: str | None) -> LabelSet:
        """The node's labels for the State served."""
        from ix_device_plugin.core.labels import label_set  # loaded only when the feature file is written

        state = self.current.state
        return label_set(state.inventory, state.plan, state.config, machine, state.inventory.cuda_version)

    def announces_reset(self) -> bool:
        """flags.reset_gpu resets at Allocate: the ConfigMap says at start that we hold the GPUs."""
        return self.config.reset_gpu

    def current_health_policy(self) -> HealthPolicy:
        """The last valid configuration's health policy."""
        return self.config.health_policy

    def self_healing_switch(self) -> str:
        """selfHealing in the last valid configuration."""
        return self.config.self_healing

    # ---- what others read ------------------------------------------------------------------

    @property
    def acting(self) -> bool:
        """True while this pod acts for the node (always, without the plugins directory: then it is alone)."""
        return self.node.acting

    @property
    def plan(self) -> Plan:
        """The plan served now."""
        return self.current.plan

    @property
    def config(self) -> Config:
        """The last valid configuration."""
        return self.current.state.config

    @property
    def inventory(self) -> Inventory:
        """The inventory served now."""
        return self.current.state.inventory

    @property
    def config_path(self) -> Path:
        """The config file in force."""
        return self.config_source.path

    @property
    def registered(self) -> bool:
        """True while registered with the kubelet."""
        return self.registrar.registered

    def live(self) -> tuple[bool, str]:
        """Liveness: serving, registration not failing for long, the GPU library answering, no task down."""
        if not self.serving_wanted:
            return True, f"standby: {self._waiting_why}"
        if not self.endpoint.serving:
            return False, f"not serving on {self.socket_path}"
        failing = self.registrar.failing_for()
        if failing is not None and failing > self.options.registration_grace:
            return False, f"registration failing for {failing:.0f}s"
        problem = self.node.problem()
        if problem is None and (down := self.service.down()):
            problem = "; ".join(down)
        if problem is not None:
            return False, problem
        return True, f"serving {self.plan.capacity()} {self.plan.resource_name} on {self.socket_path}"

    def ready(self) -> tuple[bool, str]:
        """Readiness: registered with the kubelet, or on standby (an update goes on to stop the pod serving it)."""
        if not self.serving_wanted:
            return True, f"standby: {self._waiting_why}"
        if self.registered:
            why = self.node.role_problem or "another pod acts for the node"
            standby = "" if self.acting else f"; standby: {why}"
            return True, f"registered {self.plan.resource_name}{standby}"
        return False, "not registered with the kubelet"

    # ---- running and stopping --------------------------------------------------------------

    async def run(self) -> int:
        """Serve until stop() or a signal; returns the process exit code."""
        return await self.service.run(self.start, self.shutdown)

    def stop(self) -> None:
        """Ask the daemon to stop (safe to call from a signal handler)."""
        self.service.stop()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the daemon, SIGHUP re-reads the configuration."""
        self.service.install_signal_handlers(lambda: self._events.put_nowait(ReloadRequested()))

    async def start(self) -> None:
        """Load config, discover, serve and ask for registration; raises StartupError."""
        self.endpoint.check_path()
        spawn = self.service.spawn
        if self.options.per_node_config:
            await self.config_source.follow_label(
                spawn, lambda value: self._events.put_nowait(NodeLabelChanged(value)), self._return_requests()
            )
        config = self._first_config()
        await self.node.start_probes(ProbeHandlers(live=self.live, ready=self.ready, metrics=self.metrics.render))
        acting = await self.node.start(config.fail_on_init_error, config.health_policy)  # before ListAndWatch
        view = self.node.view
        self._applied_version = view.version  # its HardwareChanged event, already queued, changes nothing
        if (problem := device_list_problem(view.inventory, config)) is not None:
            raise StartupError(f"{self.config_path}: {problem}")
        self._swap(State.of(view.inventory, config))
        log_plan(self.plan)
        # Another pod acts for the node, or a plugin with no role (an old release, Iluvatar's) serves the fixed name.
        other_pod = not acting and not self.node.role_problem  # a bad lock: nobody acts
        if missing := self.node.device_access_missing():  # 0 GPUs registered would replace a plugin's beside it
            self.serving_wanted, self._waiting_why = False, f"no device access, registering nothing: {missing}"
        elif other_pod or (fixed := fixed_name_served(self.endpoint.path)) is not None:
            who = "another pod of the plugin serves this node" if other_pod else f"another plugin serves {fixed}"
            self.serving_wanted = await self._register_beside(who)
        if self.serving_wanted:
            await self.endpoint.start(self.plan.resource_name)
            self.registrar.request()
        if acting:
            self.files.apply(self.current.state)
        spawn("reconcile", self._reconcile_loop)
        spawn("registrar", self.registrar.run)
        spawn("watch", self._watch_files)
        duties = {}
        if self.kube_settings is not None:
            spawn("volcano", self.api.run_volcano)
            duties["reset-flag"] = self.api.follow_reset_flag
        for name, task in self.node.tasks(duties, before=self._take_over).items():
            spawn(name, task)

    async def _register_beside(self, who: str) -> bool:
        """Another plugin serves the node (who says which): register beside it now (True), or wait until it stops."""
        beside, why = await registration_beside(self.options.zero_downtime_upgrade, self.apiserver)
        if beside:
            log.info("%s: registering beside it (%s)", who, why)
        else:
            self._waiting_why = f"{who}; registering once it stops ({why})"
            log.info("standby: %s", self._waiting_why)
        return beside

    async def _take_over(self) -> None:
        """As this pod comes to act for the node: register once the pod that served it has stopped (when waiting for
        it), then write the node files again and wake Volcano's announcements."""
        if not self.serving_wanted and self.node.device_access_missing() is None:
            await until_fixed_name_free(self.endpoint.path)
            await asyncio.sleep(HANDOVER_SETTLE)
            self.serving_wanted = True
            log.info("the pod that served this node has stopped: registering")
        self._events.put_nowait(RoleChanged())

    def _return_requests(self) -> AlsoFollowed | None:
        """The operator's annotation for self-healing, followed by the node label's watch (None without an API)."""
        return (return_annotation, self.node.return_seen) if self.node.follows_returns else None

    async def shutdown(self) -> None:
        """Stop every task, stop serving and remove the socket, within options.stop_timeout."""
        budget = self.options.stop_timeout
        await self.service.stop_tasks(budget * 0.4)
        await bounded("stopping the plugin server", self.endpoint.stop(grace=budget * 0.1), budget * 0.3)
        self.endpoint.remove_socket()
        self.files.close()
        await self.node.stop(budget)  # last: the pod that follows acts for the node once this one's work is all over

    # ---- the reconcile loop: the only writer of state -----------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            event = await self._events.get()
            match event:
                case FilesChanged(paths):
                    self.registrar.files_changed(paths, self.endpoint.serving)
                    self._reload_config(force=False)
                case ReloadRequested():
                    self._reload_config(force=True)
                case HardwareChanged(view):
                    self._hardware_changed(view)
                case NodeLabelChanged(value):
                    self.config_source.label_seen(value)
                    self._reload_config(force=False)
                case RoleChanged():
                    self.files.changed()
                    self.api.wake_volcano()
            if self.serving_wanted:
                await self._converge()
            if self.acting:
                self.files.apply(self.current.state)

    def _hardware_changed(self, view: HardwareView) -> None:
        if view.version > self._applied_version:
            self._serve(view.inventory, self.config)
            self._applied_version = view.version
            woken, self._applied = self._applied, asyncio.Event()
            woken.set()

    async def _converge(self) -> None:
        """Make the endpoint serve the current plan: (re)start it when lost or renamed, then register again."""
        try:
            restarted = await self.endpoint.converge(self.plan.resource_name)
        except StartupError as error:
            self._endpoint_errors.failed("%s; retrying", error)
            return
        if restarted is not None:
            log.info("plugin server restarted: %s", restarted)
            self._endpoint_errors.succeeded()
            self.registrar.request()

    def _serve(self, inventory: Inventory, config: Config) -> bool:
        """Swap in the state for inventory and config, unless its device list is too large to send; True if swapped."""
        problem = device_list_problem(inventory, config)
        if problem is not None:
            self._limit_errors.failed("not advertising the change, keeping the last device list: %s", problem)
            return False
        self._limit_errors.succeeded()
        self._swap(State.of(inventory, config))
        return True

    def _swap(self, state: State) -> None:
        before = self.current.state
        self._holders.saw(state)
        for warning in state.plan.warnings:
            log.warning("%s", warning)
        log_transitions(before.plan, state.plan)
        self.current.swap(state)
        self.files.changed()
        self.node.labels_changed()

    def _reload_config(self, force: bool) -> None:
        if not self.config_source.changed() and not force:
            return
        try:
            config = self.config_source.load()
        except SettingsError as error:
            self.metrics.config_reload_failures.inc()
            for line in error.messages:
                log.error("config change rejected, keeping the last good configuration: %s", line)
            return
        before = self.config
        if config == before:
            return
        if (problem := device_list_problem(self.inventory, config)) is not None:
            self.metrics.config_reload_failures.inc()
            log.error("config change rejected, keeping the last good configuration: %s: %s", self.config_path, problem)
            return
        self._swap(State.of(self.inventory, config))
        self.node.settings_changed()  # self-healing turned on resets the chips it left out, at once
        log.info("configuration reloaded: %s", config_diff(before, config))
        self.metrics.config_reloads.inc()

    # ---- inputs and helpers -------------------------------------------------------------------

    async def _watch_files(self) -> None:
        options = self.options
        watcher = Watcher()
        try:
            for directory in (options.plugin_dir, options.config_path.parent):
                watcher.watch(directory)
            interval = options.poll_interval if watcher.uses_inotify else options.poll_interval / 4
            while True:
                changed = await watcher.wait(interval)
                self._events.put_nowait(FilesChanged(frozenset(changed)))
        finally:
            watcher.close()

    async def _before_allocate(self, plan: Plan, request: api_pb2.AllocateRequest) -> api_pb2.AllocateRequest | None:
        """Refuse a chip reserved for a reset (by whichever pod acts for the node), then the API features' work."""
        if self.node.record is not None:
            refuse_reserved(self.node.record, plan, request)
        return await self.api.before_allocate(plan, request)

    async def rediscover(self) -> Inventory:
        """Discover again (after a GPU reset) and wait until the reconcile loop serves what was found."""
        try:
            view = await self.node.rediscover()
        except BackendError as error:
            raise GpuResetError(f"the chips could not be discovered again after the reset: {error}") from None
        await self._until_applied(view.version)
        return self.inventory

    async def _until_applied(self, version: int) -> None:
        """Once the reconcile loop serves a hardware view of at least this version."""
        while self._applied_version < version:
            await self._applied.wait()

    async def _pod_devices(self) -> dict[tuple[str, str], list[str]]:
        """(namespace, pod) -> the device IDs the kubelet gave it, from the pod-resources socket."""
        held: dict[tuple[str, str], list[str]] = {}
        allocations = await self._pod_resources.allocations({self.plan.resource_name}, self._volcano_pod_errors)
        for device_id, ref in allocations.items():
            held.setdefault((ref.namespace, ref.pod), []).append(device_id)
        return held

    def _first_config(self) -> Config:
        try:
            return self.config_source.load_at_start()
        except SettingsError as error:
            raise StartupError("\n".join(error.messages)) from None
