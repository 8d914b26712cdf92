"""The daemon: one reconcile loop owns the state; every other task only turns a happening into an event.

Inputs (tasks that put events on one queue):
- watch: the socket directory, the config's directory and /dev, woken by inotify and a timer;
- health: polls chip health every --health-interval seconds;
- discovery: re-enumerates the GPUs every minute, or soon after a hint;
- XID events: the backend's own thread hands each critical XID to the loop (call_soon_threadsafe);
- signals: SIGHUP re-reads the config; SIGTERM/SIGINT stop.
The reconcile loop takes one event at a time, computes the desired State (inventory, last
valid config, their plan) and applies it: `Current.swap` is the one place where what is
served changes. Outputs read that State: the endpoint (gRPC service), the registrar, the
probes and metrics. Backend calls run through `Hardware`, with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ix_device_plugin.core.inventory import ChipStatus, Inventory, carry_missing, xid_ignored
from ix_device_plugin.core.limits import device_list_problem
from ix_device_plugin.core.plan import Plan
from ix_device_plugin.deviceplugin.endpoint import Endpoint, identity
from ix_device_plugin.deviceplugin.features.gpureset import GpuReset, GpuResetError
from ix_device_plugin.deviceplugin.features.hook import ApiFeatures
from ix_device_plugin.deviceplugin.metrics import Metrics
from ix_device_plugin.deviceplugin.nodefiles import CdiSpecFile, NodeFile, NodeLabelFile
from ix_device_plugin.deviceplugin.outputs import CdiSpecWriter, FeatureFileWriter, OutputError, read_machine_name
from ix_device_plugin.deviceplugin.registrar import Registrar
from ix_device_plugin.deviceplugin.state import Current, State
from ix_device_plugin.deviceplugin.telemetry import ChipSample, PodRef, TelemetryCollector, chip_pods
from ix_device_plugin.hardware.backend import BackendError, XidEvent
from ix_device_plugin.hardware.devnodes import with_control_nodes
from ix_device_plugin.hardware.worker import Hardware
from ix_device_plugin.kubelet.podresources import PodResourcesClient, PodResourcesError
from ix_device_plugin.kubelet.registration import KUBELET_SOCKET
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.filewatch import Watcher
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.runtime.probes import ProbeHandlers, ProbeServer, parse_address
from ix_device_plugin.settings.config import SETTINGS, Config, ConfigError
from ix_device_plugin.settings.options import NODE_CONFIG_LABEL, Options, config_file_for, load_config
from ix_device_plugin.settings.yamlsafe import MAX_BYTES

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection

log = logging.getLogger(__name__)

_SETTLE = 0.2  # let a burst of hot-plug events settle before rediscovering
_GPU_NODE_PREFIXES = ("iluvatar", "itrctl")  # /dev entries whose coming and going means rediscover


# ---- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilesChanged:
    """The watcher woke up: these paths changed (possibly none: a timer tick)."""

    paths: frozenset[Path]


@dataclass(frozen=True)
class ReloadRequested:
    """SIGHUP: re-read the config even if its bytes look the same."""


@dataclass(frozen=True)
class HealthPolled:
    """A health poll of the inventory of `generation` ended with statuses, or with error."""

    generation: int
    statuses: Mapping[str, ChipStatus] | None
    error: str = ""


@dataclass(frozen=True)
class Discovered:
    """A rediscovery ended with an inventory, or with error; `applied` is set once the loop has taken it."""

    inventory: Inventory | None
    error: str = ""
    applied: asyncio.Event | None = None


@dataclass(frozen=True)
class TelemetrySampled:
    """A telemetry pass: each chip's figures, and which container holds which device (device ID -> pod)."""

    samples: Mapping[str, ChipSample]
    allocations: Mapping[str, PodRef]


@dataclass(frozen=True)
class NodeLabelChanged:
    """The node's configuration label has this value now (None: not set)."""

    value: str | None


@dataclass(frozen=True)
class XidOccurred:
    """The backend reported a critical XID error on a chip."""

    event: XidEvent


Event = FilesChanged | ReloadRequested | HealthPolled | Discovered | NodeLabelChanged | TelemetrySampled | XidOccurred


class Daemon:
    """One plugin instance: serves the Current state, keeps it registered and true."""

    def __init__(self, options: Options, metrics: Metrics | None = None) -> None:
        self.options = options
        self.metrics = metrics or Metrics()
        self.current = Current(State.of(Inventory(), Config()))
        self.hardware = Hardware(options.backend_factory, options.call_timeout)
        self.apiserver = api_connection(options)  # the one connection to the API server, made on first use
        self.api = ApiFeatures(
            options, self.current, self.metrics, self.hardware, self._rediscover_now, self._pod_devices, self.apiserver
        )
        self.endpoint = Endpoint(
            options.plugin_dir / options.endpoint, self.current, self.metrics.observe_call, self.api.before_allocate
        )
        self._volcano_pod_errors = OncePerError(log, logging.WARNING)
        self.registrar = Registrar(
            options.plugin_dir,
            options.endpoint,
            lambda: self.current.plan.resource_name,
            self.metrics,
            options.poll_interval,
        )
        self.metrics.read_state_from(lambda: self.current.state, lambda: self.registrar.registered)
        self.telemetry: TelemetryCollector | None = None
        self._pod_resources: PodResourcesClient | None = None
        if options.telemetry_interval is not None:
            self.telemetry = TelemetryCollector(options.node_name)
            self.metrics.registry.register(self.telemetry)
        self.socket_path = self.endpoint.path
        self.probe_port: int | None = None
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = asyncio.Event()
        self._crashed = False
        self._probes: ProbeServer | None = None
        self._config_seen: bytes | None = None
        self._label: str | None = None  # the node's configuration label, with --per-node-config
        self._first_label: asyncio.Future[str | None] | None = None
        self.config_path, self.config_reason = config_file_for(options, None)
        self._generation = 0  # bumped whenever discovery replaces the inventory
        self._discovered = False
        self._last_good_poll = time.monotonic()
        self._rediscover_soon = asyncio.Event()
        self._kubelet_id = identity(options.plugin_dir / KUBELET_SOCKET)
        self._endpoint_errors = OncePerError(log)
        self._health_errors = OncePerError(log)
        self._discovery_errors = OncePerError(log)
        self._limit_errors = OncePerError(log)
        self._files = node_files(options)
        self._file_errors = {file.name: OncePerError(log) for file in self._files}
        self._files_due = bool(self._files)

    # ---- what others read ------------------------------------------------------------------

    @property
    def gpu_reset(self) -> GpuReset:
        """The GPU reset service (flags.reset_gpu)."""
        return self.api.gpu_reset

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
    def registered(self) -> bool:
        """True while registered with the kubelet."""
        return self.registrar.registered

    def live(self) -> tuple[bool, str]:
        """Liveness: serving, registration not failing for long, the GPU library answering."""
        if not self.endpoint.serving:
            return False, f"not serving on {self.socket_path}"
        failing = self.registrar.failing_for()
        if failing is not None and failing > self.options.registration_grace:
            return False, f"registration failing for {failing:.0f}s"
        stuck = self.hardware.stuck_for()
        if stuck is not None:
            return False, f"GPU library call {stuck[0]}() has not returned for {stuck[1]:.0f}s"
        if self._discovered:
            age = time.monotonic() - self._last_good_poll
            if age > self.options.health_stale_after:
                return False, f"no successful health poll for {age:.0f}s"
        return True, f"serving {self.plan.capacity()} {self.plan.resource_name} on {self.socket_path}"

    def ready(self) -> tuple[bool, str]:
        """Readiness: registered with the kubelet."""
        if self.registered:
            return True, f"registered {self.plan.resource_name}"
        return False, "not registered with the kubelet"

    # ---- running and stopping --------------------------------------------------------------

    async def run(self) -> int:
        """Serve until stop() or a signal; returns the process exit code."""
        starting = asyncio.create_task(self.start(), name="start")
        stop = asyncio.create_task(self._stopping.wait(), name="stop-request")
        await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if not starting.done():
            starting.cancel()  # a stop during start-up (e.g. a slow discovery) does not wait for it
        elif (error := starting.exception()) is not None:
            if isinstance(error, StartupError | ConfigError):
                for line in str(error).splitlines():
                    log.error("%s", line)
            else:
                log.error("internal failure while starting; stopping", exc_info=error)
            code = 1
        else:
            await stop
        stop.cancel()
        await self.shutdown()
        return 1 if self._crashed else code

    async def start(self) -> None:
        """Load config, discover, serve and ask for registration; raises StartupError or ConfigError."""
        if self.options.per_node_config:
            await self._follow_node_label()
        config = self._load_config()
        self._config_seen = _read_bytes(self.config_path)
        await self._start_probes()
        await self._watch_xids()
        inventory = carry_missing(Inventory(), await self._first_discovery(config))
        if (problem := device_list_problem(inventory, config)) is not None:
            raise ConfigError([f"{self.config_path}: {problem}"])
        self._swap(State.of(inventory, config))
        self._log_plan()
        await self.endpoint.start(self.plan.resource_name)
        self.registrar.request()
        self._write_files()
        self._spawn("reconcile", self._reconcile_loop())
        self._spawn("registrar", self.registrar.run())
        self._spawn("watch", self._watch_files())
        self._spawn("health", self._poll_health())
        self._spawn("discovery", self._rediscover())
        if self.telemetry is not None:
            self._spawn("telemetry", self._sample_telemetry())
        if self.options.kube is not None:
            self._spawn("volcano", self.api.run_volcano())
            self._spawn("reset-announce", self.api.announce_reset())

    def stop(self) -> None:
        """Ask the daemon to stop (safe to call from a signal handler)."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the daemon, SIGHUP re-reads the configuration."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop)
        loop.add_signal_handler(signal.SIGINT, self.stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: self._events.put_nowait(ReloadRequested()))

    async def shutdown(self) -> None:
        """Stop every task, stop serving and remove the socket, within options.stop_timeout."""
        budget = self.options.stop_timeout
        tasks = dict(self._tasks)
        self._tasks.clear()
        for task in tasks.values():
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks.values(), timeout=budget * 0.4)
            for name, task in tasks.items():
                if task in pending:
                    log.error("task %s did not stop in time; abandoning it", name)
        await self._bounded("stopping the plugin server", self.endpoint.stop(grace=budget * 0.1), budget * 0.3)
        self.endpoint.remove_socket()
        await self._bounded("ending the API features", self.api.close(timeout=budget * 0.2), budget * 0.25)
        if self.apiserver is not None:
            await self._bounded("closing the API connection", self.apiserver.close(), budget * 0.05)
        if self._probes is not None:
            await self._bounded("stopping the probe server", self._probes.stop(), budget * 0.1)
        for file in self._files:
            try:
                file.close()
            except OutputError as error:
                log.warning("%s: %s", file.name, error)
        if self._pod_resources is not None:
            await self._bounded("closing the pod-resources channel", self._pod_resources.close(), budget * 0.05)
        # Room for the XID waiter's last bounded wait (EVENT_WAIT_MS), which must end before IXML shuts down.
        await self.hardware.close(timeout=budget * 0.4)

    async def _bounded(self, what: str, work: Coroutine[Any, Any, None], timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await work
        except TimeoutError:
            log.error("%s took longer than %.1fs; abandoning it", what, timeout)

    def _spawn(self, name: str, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks[name] = task
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        log.error("internal task %s failed; stopping", task.get_name(), exc_info=task.exception())
        self._crashed = True
        self.stop()

    # ---- the reconcile loop: the only writer of state -----------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            event = await self._events.get()
            match event:
                case FilesChanged(paths):
                    await self._files_changed(paths)
                case ReloadRequested():
                    self._reload_config(force=True)
                case HealthPolled():
                    self._health_polled(event)
                case Discovered():
                    self._discovered_inventory(event)
                    if event.applied is not None:
                        event.applied.set()
                case TelemetrySampled(samples, allocations):
                    assert self.telemetry is not None
                    self.telemetry.update(samples, self.inventory, chip_pods(self.plan, allocations))
                case NodeLabelChanged(value):
                    self._label = value
                    self._reload_config(force=False)
                case XidOccurred(xid_event):
                    self._xid_occurred(xid_event)
            await self._converge()
            self._write_files()

    async def _files_changed(self, paths: frozenset[Path]) -> None:
        kubelet = self.options.plugin_dir / KUBELET_SOCKET
        kubelet_now = identity(kubelet)
        recreated = kubelet_now is not None and (kubelet in paths or kubelet_now != self._kubelet_id)
        self._kubelet_id = kubelet_now
        if recreated and self.endpoint.serving and kubelet_now and self.registrar.kubelet_restarted(kubelet_now):
            log.info("kubelet restarted (%s re-created); registering again", kubelet)
        self._reload_config(force=False)
        dev_dir = self.options.dev_root / "dev"
        if any(path.parent == dev_dir and path.name.startswith(_GPU_NODE_PREFIXES) for path in paths):
            self._rediscover_soon.set()

    async def _converge(self) -> None:
        """Make the endpoint serve the current plan: (re)start it when lost or renamed."""
        name = self.plan.resource_name
        if self.endpoint.serving and self.endpoint.resource_name == name:
            return
        if self.endpoint.service is None:
            reason = "not serving"
        elif not self.endpoint.serving:
            reason = f"socket {self.socket_path} was removed"
        else:
            reason = f"resource name changed to {name}"
        if not self._endpoint_errors.failing:
            log.info("restarting the plugin server: %s", reason)
        await self.endpoint.stop(grace=0)
        try:
            await self.endpoint.start(name)
        except StartupError as error:
            self._endpoint_errors.failed("%s; retrying", error)
            return
        self._endpoint_errors.succeeded("serving again on %s", self.socket_path)
        self.registrar.request()

    def _write_files(self) -> None:
        """Bring every node file in step with the current state; a failure is logged once and retried."""
        if not self._files_due:
            return
        self._files_due = False
        state = self.current.state
        for file in self._files:
            errors = self._file_errors[file.name]
            try:
                file.apply(state)
            except OutputError as error:
                errors.failed("%s not written, retrying: %s", file.name, error)
                self._files_due = True
            else:
                errors.succeeded("%s written again", file.name)

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
        for warning in state.plan.warnings:
            log.warning("%s", warning)
        _log_transitions(before.plan, state.plan)
        self.current.swap(state)
        self._files_due = bool(self._files)

    def _reload_config(self, force: bool) -> None:
        path, reason = config_file_for(self.options, self._label)
        if path != self.config_path:
            log.info("configuration now from %s", reason)
            self.config_path, force = path, True
        self.config_reason = reason
        seen = _read_bytes(path)
        if seen == self._config_seen and not force:
            return
        self._config_seen = seen
        try:
            config = self._load_config()
        except ConfigError as error:
            self.metrics.config_reload_failures.inc()
            for line in error.messages:
                log.error("config change rejected, keeping the last good configuration: %s", line)
            return
        before = self.config
        if config == before:
            return
        if (problem := device_list_problem(self.inventory, config)) is not None:
            self.metrics.config_reload_failures.inc()
            log.error("config change rejected, keeping the last good configuration: %s: %s", path, problem)
            return
        self._swap(State.of(self.inventory, config))
        log.info("configuration reloaded: %s", _config_diff(before, config))
        self.metrics.config_reloads.inc()

    def _load_config(self) -> Config:
        config, warnings = load_config(self.options, self.config_path)
        for warning in warnings:
            log.warning("%s", warning)
        return config

    def _health_polled(self, event: HealthPolled) -> None:
        if event.generation != self._generation:
            return  # polled an inventory that a rediscovery has replaced since
        inventory = self.inventory
        statuses = event.statuses
        if statuses is None:
            self._health_errors.failed("health check failed for every chip: %s", event.error)
            problem = f"health check failed: {event.error}"
            statuses = {chip.uuid: ChipStatus(problems=(problem,)) for chip in inventory.chips()}
        else:
            self._health_errors.succeeded("health checks answer again")
            self._last_good_poll = time.monotonic()
            self.metrics.observe_health_poll()
            if any(not status.present for status in statuses.values()):
                self._rediscover_soon.set()
        current = inventory.statuses()
        statuses = {uuid: _keeping_xids(status, current.get(uuid)) for uuid, status in statuses.items()}
        if all(current.get(uuid) == status for uuid, status in statuses.items()):
            return  # nothing changed: no need to re-plan (most polls, on a healthy node)
        self._serve(inventory.with_statuses(statuses), self.config)

    def _discovered_inventory(self, event: Discovered) -> None:
        if event.inventory is None:
            self._discovery_errors.failed("GPU discovery failed: %s", event.error)
            return
        self._discovery_errors.succeeded()
        inventory = carry_missing(self.inventory, event.inventory)
        previous = self.inventory.statuses()
        inventory = inventory.with_statuses(
            {chip.uuid: _keeping_xids(chip.status, previous.get(chip.uuid)) for chip in inventory.chips()}
        )
        if _chip_set(inventory) != _chip_set(self.inventory):
            log.info("GPU inventory changed: %d -> %d chips", self.inventory.chip_count(), inventory.chip_count())
        if not self._discovered:
            self._note_first_discovery(inventory)
        if self._serve(inventory, self.config):
            self._generation += 1

    def _xid_occurred(self, event: XidEvent) -> None:
        """A critical XID: the chip is Unhealthy from now on (unless the XID is ignored), until the plugin restarts."""
        self.metrics.xid_events.labels(xid=str(event.xid)).inc()
        chip = next((chip for chip in self.inventory.chips() if chip.uuid == event.uuid), None)
        if chip is None:
            log.info("XID %d on %s, a chip not served now; ignored", event.xid, event.uuid)
            return
        if xid_ignored(event.xid, self.config.ignored_health_errors):
            log.info(
                "XID %d on %s ignored (an application XID, or listed in IX_DISABLE_HEALTHCHECKS)", event.xid, chip.uuid
            )
            return
        status = chip.status.with_xids(frozenset({event.xid}))
        if status == chip.status:
            return  # the same XID again: the chip is Unhealthy already
        log.warning(
            "XID %d on %s: a critical error; the chip is Unhealthy until the plugin restarts", event.xid, chip.uuid
        )
        self._serve(self.inventory.with_statuses({chip.uuid: status}), self.config)

    # ---- inputs: each only turns a happening into an event ----------------------------------

    async def _watch_xids(self) -> None:
        """Ask the backend to hand XID events to the loop; without them, health comes from polling alone."""
        loop = asyncio.get_running_loop()

        def sink(event: XidEvent) -> None:  # runs on the backend's event thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon has stopped
                loop.call_soon_threadsafe(self._events.put_nowait, XidOccurred(event))

        try:
            await self.hardware.call("watch_xids", lambda backend: backend.watch_xids(sink))
        except BackendError as error:  # the backend cannot be opened: discovery says why
            log.debug("no XID events: %s", error)

    async def _watch_files(self) -> None:
        options = self.options
        watcher = Watcher()
        try:
            for directory in (options.plugin_dir, options.config_path.parent, options.dev_root / "dev"):
                watcher.watch(directory)
            interval = options.poll_interval if watcher.uses_inotify else options.poll_interval / 4
            while True:
                changed = await watcher.wait(interval)
                self._events.put_nowait(FilesChanged(frozenset(changed)))
        finally:
            watcher.close()

    async def _poll_health(self) -> None:
        while True:
            await asyncio.sleep(self.options.health_interval)
            if not self._discovered:
                continue
            generation, inventory = self._generation, self.inventory
            try:
                statuses = await self.hardware.call("health", lambda backend, polled=inventory: backend.health(polled))
            except BackendError as error:
                self._events.put_nowait(HealthPolled(generation, None, str(error)))
            else:
                self._events.put_nowait(HealthPolled(generation, statuses))

    async def _sample_telemetry(self) -> None:
        interval = self.options.telemetry_interval
        assert interval is not None
        errors, pod_errors = OncePerError(log, logging.WARNING), OncePerError(log, logging.WARNING)
        while not self._discovered:
            await asyncio.sleep(min(interval, _SETTLE))
        while True:
            inventory = self.inventory
            try:
                samples = await self.hardware.call("sample", lambda backend, seen=inventory: backend.sample(seen))
            except BackendError as error:
                errors.failed("telemetry pass failed: %s", error)
            else:
                errors.succeeded("telemetry passes work again")
                self._events.put_nowait(TelemetrySampled(samples, await self._allocations(pod_errors)))
            await asyncio.sleep(interval)

    async def _allocations(self, errors: OncePerError) -> Mapping[str, PodRef]:
        """Which container holds which device, from the kubelet's pod-resources API (empty when unknown)."""
        socket_path = self.options.pod_resources_socket
        if socket_path is None or not socket_path.exists():
            return {}
        if self._pod_resources is None:
            self._pod_resources = PodResourcesClient(socket_path)
        try:
            allocations = await self._pod_resources.allocations({self.plan.resource_name}, timeout=2.0)
        except PodResourcesError as error:
            errors.failed("%s; GPU metrics carry no pod labels meanwhile", error)
            return {}
        errors.succeeded("pod resources answer again")
        return allocations

    async def _rediscover(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.options.rediscover_interval):
                    await self._rediscover_soon.wait()
            except TimeoutError:
                pass
            await asyncio.sleep(_SETTLE)
            self._rediscover_soon.clear()
            try:
                inventory = await self._discover()
            except BackendError as error:
                self._events.put_nowait(Discovered(None, str(error)))
            else:
                self._events.put_nowait(Discovered(inventory))

    async def _follow_node_label(self) -> None:
        """Start following the node's configuration label; wait briefly for its first value."""
        self._first_label = asyncio.get_running_loop().create_future()
        self._spawn("node-label", self._watch_node_label())
        try:
            async with asyncio.timeout(self.options.label_wait):
                self._label = await asyncio.shield(self._first_label)
        except TimeoutError:
            log.warning(
                "no answer about node label %s within %gs; starting with %s",
                NODE_CONFIG_LABEL,
                self.options.label_wait,
                self.options.config_path,
            )
        self.config_path, self.config_reason = config_file_for(self.options, self._label)
        log.info("configuration from %s", self.config_reason)

    async def _watch_node_label(self) -> None:
        from ix_device_plugin.apiserver.nodelabel import NodeLabelWatcher

        assert self.apiserver is not None
        await NodeLabelWatcher(self.apiserver, NODE_CONFIG_LABEL).run(self._label_seen)

    def _label_seen(self, value: str | None) -> None:
        if self._first_label is not None and not self._first_label.done():
            self._first_label.set_result(value)
        self._events.put_nowait(NodeLabelChanged(value))

    # ---- what the API features need from the loop ---------------------------------------------

    async def _rediscover_now(self) -> Inventory:
        """Discover again and wait until the reconcile loop serves what was found."""
        try:
            inventory = await self._discover()
        except BackendError as error:
            raise GpuResetError(f"the chips could not be discovered again after the reset: {error}") from None
        applied = asyncio.Event()
        self._events.put_nowait(Discovered(inventory, applied=applied))
        await applied.wait()
        return self.inventory

    async def _pod_devices(self) -> dict[tuple[str, str], list[str]]:
        """(namespace, pod) -> the device IDs the kubelet gave it, from the pod-resources socket."""
        held: dict[tuple[str, str], list[str]] = {}
        for device_id, ref in (await self._allocations(self._volcano_pod_errors)).items():
            held.setdefault((ref.namespace, ref.pod), []).append(device_id)
        return held

    # ---- start-up helpers --------------------------------------------------------------------

    async def _discover(self) -> Inventory:
        inventory = await self.hardware.call("discover", lambda backend: backend.discover())
        return with_control_nodes(inventory, self.options.dev_root)

    async def _first_discovery(self, config: Config) -> Inventory:
        try:
            inventory = await self._discover()
        except BackendError as error:
            self._discovery_errors.failed("GPU discovery failed: %s", error)
            if config.fail_on_init_error:
                raise StartupError(
                    "no GPUs could be discovered; exiting (set flags.failOnInitError: false to keep "
                    "running with 0 GPUs and retry every minute)"
                ) from None
            log.warning("continuing with 0 GPUs; retrying discovery every %gs", self.options.rediscover_interval)
            return Inventory()
        self._note_first_discovery(inventory)
        return inventory

    def _note_first_discovery(self, inventory: Inventory) -> None:
        log.info(
            "found %d boards, %d chips (driver %s)",
            len(inventory.boards),
            inventory.chip_count(),
            inventory.driver_version or "unknown",
        )
        self._discovered = True
        self._last_good_poll = time.monotonic()

    def _log_plan(self) -> None:
        log.info(
            "advertising %d %s (%d healthy)",
            self.plan.capacity(),
            self.plan.resource_name,
            self.plan.healthy_count(),
        )
        for device in self.plan.devices:
            if not device.healthy and device.replica in (None, 0):
                log.warning("GPU %s is Unhealthy: %s", device.gpu, "; ".join(device.reasons))

    async def _start_probes(self) -> None:
        address = parse_address(self.options.health_address)
        if address is None:
            return
        self._probes = ProbeServer(ProbeHandlers(live=self.live, ready=self.ready, metrics=self.metrics.render))
        try:
            self.probe_port = await self._probes.start(*address)
        except OSError as error:
            self._probes = None
            raise StartupError(f"cannot listen on --health-address {self.options.health_address}: {error}") from error


def api_connection(options: Options) -> ApiConnection | None:
    """The connection to the API server, when a feature needs one (nothing is imported or asked before its use)."""
    if options.kube is None:
        return None
    from ix_device_plugin.apiserver.connection import ApiConnection

    return ApiConnection(options.kube)


def node_files(options: Options) -> list[NodeFile]:
    """The node files options turn on."""
    files: list[NodeFile] = []
    if options.cdi_spec_dir is not None:
        files.append(CdiSpecFile(CdiSpecWriter(options.cdi_spec_dir, options.dev_root)))
    if options.node_feature_dir is not None:
        machine = read_machine_name(options.sysfs_root)
        files.append(NodeLabelFile(FeatureFileWriter(options.node_feature_dir), machine))
    return files


def _read_bytes(path: Path) -> bytes | None:
    """The config file's bytes, at most one more than a ConfigMap can hold (enough to tell it changed)."""
    try:
        with path.open("rb") as stream:
            return stream.read(MAX_BYTES + 1)
    except OSError:
        return None


def _keeping_xids(status: ChipStatus, before: ChipStatus | None) -> ChipStatus:
    """status, keeping the XIDs the chip had before: a poll or rediscovery does not clear them."""
    return status if before is None else status.with_xids(before.xids)


def _chip_set(inventory: Inventory) -> frozenset[str]:
    return frozenset(chip.uuid for chip in inventory.chips() if chip.status.present)


def _log_transitions(before: Plan, after: Plan) -> None:
    """One line per physical GPU whose health changed, with the chip and reason."""
    old = {d.gpu: d for d in before.devices}
    for device in after.devices:
        if device.replica not in (None, 0):
            continue
        previous = old.get(device.gpu)
        if previous is None or previous.healthy == device.healthy:
            continue
        if device.healthy:
            log.info("GPU %s is Healthy again", device.gpu)
        else:
            log.warning("GPU %s became Unhealthy: %s", device.gpu, "; ".join(device.reasons))


def _config_diff(before: Config, after: Config) -> str:
    changes = [
        f"{s.key} {getattr(before, s.attr)!r} -> {getattr(after, s.attr)!r}"
        for s in SETTINGS
        if getattr(before, s.attr) != getattr(after, s.attr)
    ]
    return ", ".join(changes) or "no effective change"
