"""The daemon: owns every task and timer, and the only place where state changes.

Tasks, all on one asyncio loop:
- registration: registers with the kubelet whenever asked, with capped backoff;
- watch: notices kubelet restarts (socket directory), config changes (the
  ConfigMap's `..data` symlink swap) and device nodes appearing or vanishing;
- health: polls chip health every --health-interval seconds;
- discovery: re-enumerates the GPUs every minute, or soon after a hint.
Blocking backend calls run in a worker thread, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from ix_device_plugin.api import api_pb2_grpc
from ix_device_plugin.backends.base import Backend, BackendError
from ix_device_plugin.config import DEFAULT_CONFIG_PATH, SETTINGS, Config, ConfigError, load_file, resolve
from ix_device_plugin.devnodes import with_control_nodes
from ix_device_plugin.inventory import ChipStatus, Inventory
from ix_device_plugin.metrics import Metrics
from ix_device_plugin.plan import Plan, plan
from ix_device_plugin.probes import ProbeHandlers, ProbeServer, parse_address
from ix_device_plugin.registration import KUBELET_SOCKET, RegistrationError, register, unix_target
from ix_device_plugin.server import DevicePluginService
from ix_device_plugin.watch import Watcher

log = logging.getLogger(__name__)

ENDPOINT = "iluvatar-gpu.sock"
_BACKOFF_START = 0.05
_BACKOFF_MAX = 5.0


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


@dataclass
class Options:
    """Everything the daemon needs to know, already validated."""

    backend_factory: Callable[[], Backend]
    plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    config_path: Path = Path(DEFAULT_CONFIG_PATH)
    config_required: bool = False  # a named file must exist; the default path may be absent
    flags: Mapping[str, Any] = field(default_factory=dict)  # config values from flags, by attr
    env: Mapping[str, str] = field(default_factory=dict)
    dev_root: Path = Path("/")
    health_interval: float = 5.0
    health_address: str = ":8080"
    endpoint: str = ENDPOINT
    rediscover_interval: float = 60.0
    poll_interval: float = 1.0  # stat check when inotify wakes us; polling alone uses a quarter
    registration_grace: float = 60.0  # /healthz fails after registration has failed this long


def load_config(options: Options) -> Config:
    """The effective configuration for options; raises ConfigError."""
    path = options.config_path
    file = None
    if path.exists() or options.config_required:
        file = load_file(path)
        for warning in file.warnings:
            log.warning("%s", warning)
    return resolve(file, options.env, options.flags)


def _read_config_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def _socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


class Daemon:
    """One plugin instance: serves a Plan, keeps it registered and true."""

    def __init__(self, options: Options, metrics: Metrics | None = None) -> None:
        self.options = options
        self.metrics = metrics or Metrics()
        self.config = Config()
        self.inventory = Inventory()
        self.plan: Plan = plan(self.inventory, self.config)
        self.registered = False
        self.socket_path = options.plugin_dir / options.endpoint
        self.probe_port: int | None = None
        self._backend: Backend | None = None
        self._discovered = False
        self._service: DevicePluginService | None = None
        self._server: grpc.aio.Server | None = None
        self._socket_id: tuple[int, int] | None = None
        self._register_wanted = asyncio.Event()
        self._register_kick = asyncio.Event()
        self._register_requests = 0  # bumped by every request; a success answers only the latest
        self._rediscover_soon = asyncio.Event()
        self._stopping = asyncio.Event()
        self._failing_since: float | None = None
        self._config_seen: bytes | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._probes: ProbeServer | None = None
        self._lock = asyncio.Lock()
        self._recover_failed = False
        self._discovery_error = ""
        self._crashed = False

    # ---- public -------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until stop() or a signal; returns the process exit code."""
        try:
            await self.start()
        except (StartupError, ConfigError) as error:
            for line in str(error).splitlines():
                log.error("%s", line)
            await self.shutdown()
            return 1
        await self._stopping.wait()
        await self.shutdown()
        return 1 if self._crashed else 0

    async def start(self) -> None:
        """Load config, discover, serve and ask for registration; raises StartupError or ConfigError."""
        self.config = load_config(self.options)
        self._config_seen = _read_config_bytes(self.options.config_path)
        await self._start_probes()
        inventory = await self._discover()
        if inventory is None:
            if self.config.fail_on_init_error:
                raise StartupError(
                    "no GPUs could be discovered; exiting (set flags.failOnInitError: false to keep "
                    "running with 0 GPUs and retry every minute)"
                )
            log.warning("continuing with 0 GPUs; retrying discovery every %gs", self.options.rediscover_interval)
            inventory = Inventory()
        self.inventory = inventory
        self.plan = self._plan_for(inventory)
        self._log_plan()
        await self._start_server()
        self._request_registration()
        self._spawn(self._registration_loop(), self._watch_loop(), self._health_loop(), self._discovery_loop())

    def stop(self) -> None:
        """Ask the daemon to stop (safe to call from a signal handler)."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the daemon, SIGHUP re-reads the configuration."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop)
        loop.add_signal_handler(signal.SIGINT, self.stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload_config(force=True)))

    async def shutdown(self) -> None:
        """Stop tasks, end streams, stop serving, remove the socket, release the backend."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._stop_server(grace=0.5)
        if self._probes is not None:
            await self._probes.stop()
        if self._backend is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._backend.close)
        self.registered = False
        self.metrics.registered.set(0)

    def live(self) -> tuple[bool, str]:
        """Liveness: serving, and not failing to register for longer than the grace period."""
        if self._server is None or not self.socket_path.exists():
            return False, f"not serving on {self.socket_path}"
        if self._failing_since is not None:
            failing = time.monotonic() - self._failing_since
            if failing > self.options.registration_grace:
                return False, f"registration failing for {failing:.0f}s"
        return True, f"serving {self.plan.capacity()} {self.plan.resource_name} on {self.socket_path}"

    def ready(self) -> tuple[bool, str]:
        """Readiness: registered with the kubelet."""
        if self.registered:
            return True, f"registered {self.plan.resource_name}"
        return False, "not registered with the kubelet"

    async def reload_config(self, force: bool = False) -> None:
        """Re-read the config file; apply it when valid and changed, else keep the last good one."""
        seen = _read_config_bytes(self.options.config_path)
        if seen == self._config_seen and not force:
            return
        self._config_seen = seen
        try:
            config = load_config(self.options)
        except ConfigError as error:
            self.metrics.config_reload_failures.inc()
            for line in error.messages:
                log.error("config change rejected, keeping the last good configuration: %s", line)
            return
        if config == self.config:
            return
        async with self._lock:
            before = self.config
            self.config = config
            new_plan = self._plan_for(self.inventory)
            log.info("configuration reloaded: %s", _config_diff(before, config))
            self.metrics.config_reloads.inc()
            if new_plan.resource_name != self.plan.resource_name:
                self.plan = new_plan
                await self._restart_server("resource name changed")
            else:
                await self._publish(new_plan)

    # ---- serving --------------------------------------------------------------------------

    async def _start_server(self) -> None:
        path = self.socket_path
        if not path.parent.is_dir():
            raise StartupError(
                f"device plugin directory {path.parent} does not exist (is the kubelet's "
                "/var/lib/kubelet/device-plugins mounted? see --device-plugin-path)"
            )
        if path.exists() or path.is_symlink():
            if _socket_answers(path):
                raise StartupError(
                    f"another plugin is already serving on {path}; stop it first (or remove the socket "
                    "if you are sure it is gone)"
                )
            log.info("removing stale socket %s", path)
            path.unlink(missing_ok=True)
        self._service = DevicePluginService(self.plan, self.metrics.observe_call)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self._service, server)
        try:
            server.add_insecure_port(unix_target(path))
        except RuntimeError as error:
            raise StartupError(f"cannot listen on {path}: {error}") from error
        await server.start()
        self._server = server
        self._socket_id = _identity(path)
        log.info("serving %s on %s", self.plan.resource_name, path)

    async def _stop_server(self, grace: float) -> None:
        service, server = self._service, self._server
        self._service, self._server = None, None
        if service is not None:
            await service.close()
        if server is not None:
            await server.stop(grace)
        if self._socket_id is not None and _identity(self.socket_path) == self._socket_id:
            self.socket_path.unlink(missing_ok=True)
        self._socket_id = None

    async def _restart_server(self, reason: str) -> None:
        if not self._recover_failed:
            log.info("restarting the plugin server: %s", reason)
        self.registered = False  # also while a failed restart leaves nothing serving
        self.metrics.registered.set(0)
        await self._stop_server(grace=0)
        await self._start_server()
        self.metrics.reregistrations.inc()
        self._request_registration()

    async def _publish(self, new_plan: Plan) -> None:
        _log_transitions(self.plan, new_plan)
        changed = _device_view(new_plan) != _device_view(self.plan)
        self.plan = new_plan
        self.metrics.observe_plan(new_plan, self.inventory)
        if changed and self._service is not None:
            await self._service.publish(new_plan)

    # ---- tasks ----------------------------------------------------------------------------

    def _spawn(self, *coroutines: Coroutine[Any, Any, None]) -> None:
        for coroutine in coroutines:
            task = asyncio.create_task(coroutine)
            self._tasks.append(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks and task.done():
            self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("internal task failed; stopping", exc_info=task.exception())
            self._crashed = True
            self.stop()

    def _request_registration(self) -> None:
        """Ask the registration loop to register (again), waking it from any backoff."""
        self.registered = False
        self.metrics.registered.set(0)
        self._register_requests += 1
        self._register_wanted.set()
        self._register_kick.set()

    async def _registration_loop(self) -> None:
        delay = _BACKOFF_START
        last_error = ""
        while True:
            await self._register_wanted.wait()
            self._register_kick.clear()
            answering = self._register_requests
            try:
                await register(self.options.plugin_dir, self.options.endpoint, self.plan.resource_name)
            except RegistrationError as error:
                self.metrics.registration_failures.inc()
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                if str(error) != last_error:
                    log.warning("%s; retrying with backoff up to %gs", error, _BACKOFF_MAX)
                    last_error = str(error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._register_kick.wait(), delay)
                delay = min(delay * 2, _BACKOFF_MAX)
                continue
            if answering != self._register_requests:
                continue  # the kubelet restarted while this attempt was in flight: register with the new one
            self._register_wanted.clear()
            self.registered = True
            self._failing_since = None
            delay, last_error = _BACKOFF_START, ""
            self.metrics.registrations.inc()
            self.metrics.registered.set(1)
            log.info("registered %s with the kubelet (%d devices)", self.plan.resource_name, self.plan.capacity())

    async def _watch_loop(self) -> None:
        options = self.options
        watcher = Watcher()
        try:
            watcher.watch(options.plugin_dir)
            watcher.watch(options.config_path.parent)
            dev_dir = options.dev_root / "dev"
            watcher.watch(dev_dir)
            interval = options.poll_interval if watcher.uses_inotify else options.poll_interval / 4
            kubelet = options.plugin_dir / KUBELET_SOCKET
            kubelet_id = _identity(kubelet)
            while True:
                changed = await watcher.wait(interval)
                kubelet_now = _identity(kubelet)
                recreated = kubelet_now is not None and (kubelet in changed or kubelet_now != kubelet_id)
                kubelet_id = kubelet_now
                if self._server is None or _identity(self.socket_path) != self._socket_id:
                    await self._recover_server()
                elif recreated:
                    log.info("kubelet restarted (%s re-created); registering again", kubelet)
                    self.metrics.reregistrations.inc()
                    self._request_registration()
                await self.reload_config()
                if any(path.parent == dev_dir and path.name.startswith("iluvatar") for path in changed):
                    self._rediscover_soon.set()
        finally:
            watcher.close()

    async def _recover_server(self) -> None:
        """Serve a fresh socket after ours vanished; on failure, say so once and retry next tick."""
        async with self._lock:
            try:
                await self._restart_server(f"socket {self.socket_path} was removed")
            except StartupError as error:
                if not self._recover_failed:
                    log.error("%s; retrying", error)
                self._recover_failed = True
            else:
                self._recover_failed = False

    async def _health_loop(self) -> None:
        last_error = ""
        while True:
            await asyncio.sleep(self.options.health_interval)
            if not self._discovered or self._backend is None:
                continue
            backend, inventory = self._backend, self.inventory
            try:
                statuses = await asyncio.to_thread(backend.health, inventory)
            except BackendError as error:
                if str(error) != last_error:
                    log.error("health check failed for every chip: %s", error)
                    last_error = str(error)
                statuses = {
                    chip.uuid: ChipStatus(problems=(f"health check failed: {error}",)) for chip in inventory.chips()
                }
            else:
                last_error = ""
                self.metrics.observe_health_poll()
            if any(not status.present for status in statuses.values()):
                self._rediscover_soon.set()
            current = inventory.statuses()
            if all(current.get(uuid) == status for uuid, status in statuses.items()):
                continue  # nothing changed: no need to re-plan (most polls, on a healthy node)
            async with self._lock:
                if self.inventory is inventory:  # a rediscovery may have replaced it meanwhile
                    self.inventory = inventory.with_statuses(statuses)
                    await self._publish(self._plan_for(self.inventory))

    async def _discovery_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rediscover_soon.wait(), self.options.rediscover_interval)
            await asyncio.sleep(0.2)  # let a burst of hot-plug events settle
            self._rediscover_soon.clear()
            inventory = await self._discover()
            if inventory is None:
                continue
            async with self._lock:
                if _chip_set(inventory) != _chip_set(self.inventory):
                    log.info(
                        "GPU inventory changed: %d -> %d chips",
                        self.inventory.chip_count(),
                        inventory.chip_count(),
                    )
                self.inventory = inventory
                await self._publish(self._plan_for(inventory))

    # ---- helpers --------------------------------------------------------------------------

    async def _discover(self) -> Inventory | None:
        """Enumerate the GPUs; None (and one log line) when the backend cannot."""
        try:
            if self._backend is None:
                self._backend = self.options.backend_factory()
            inventory = await asyncio.to_thread(self._backend.discover)
        except BackendError as error:
            if str(error) != self._discovery_error:  # once per distinct failure, not every minute
                log.error("GPU discovery failed: %s", error)
                self._discovery_error = str(error)
            return None
        self._discovery_error = ""
        if not self._discovered:
            log.info(
                "found %d boards, %d chips (driver %s)",
                len(inventory.boards),
                inventory.chip_count(),
                inventory.driver_version or "unknown",
            )
        self._discovered = True
        return with_control_nodes(inventory, self.options.dev_root)

    def _plan_for(self, inventory: Inventory) -> Plan:
        new_plan = plan(inventory, self.config)
        for warning in new_plan.warnings:
            log.warning("%s", warning)
        return new_plan

    def _log_plan(self) -> None:
        self.metrics.observe_plan(self.plan, self.inventory)
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
            raise StartupError(f"cannot listen on --health-address {self.options.health_address}: {error}") from error


def _device_view(p: Plan) -> tuple[str, tuple[tuple[str, bool, tuple[int, ...]], ...]]:
    return p.resource_name, tuple((d.id, d.healthy, d.numa_nodes) for d in p.devices)


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
