"""The DRA mode (`ix-device-plugin dra`): the kubelet plugin of driver gpu.iluvatar.com and its ResourceSlice.

One task owns the node's state (`DraDriver._watch_hardware`: discovery, health polls, rediscovery for
hot-plug); it swaps in a new SliceContent whole. The others read it: the slice publisher (API server,
retried with backoff, never fatal), the registration service on `<registrar dir>/gpu.iluvatar.com-reg.sock`,
and the DRAPlugin service (v1 and v1beta1) on `<plugins dir>/gpu.iluvatar.com/dra.sock`, whose prepare and
unprepare go through the `ClaimStore` (prepared claims, their CDI specs and the checkpoint).

On a clean stop the sockets are removed and the slice is kept: a restart or an upgrade does not withdraw the
chips from the scheduler, and the kubelet deletes the slices of a driver that stays unregistered (uninstall).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ix_device_plugin.api.dra_v1 import api_pb2 as dra_v1
from ix_device_plugin.api.dra_v1 import api_pb2_grpc as dra_v1_grpc
from ix_device_plugin.api.dra_v1beta1 import api_pb2 as dra_v1beta1
from ix_device_plugin.api.dra_v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from ix_device_plugin.api.pluginregistration import api_pb2 as registration_pb2
from ix_device_plugin.api.pluginregistration import api_pb2_grpc as registration_grpc
from ix_device_plugin.apiserver.client import Kube
from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.errors import KubeAlreadyExists, KubeError
from ix_device_plugin.apiserver.objects import RESOURCE_CLAIM, RESOURCE_SLICE
from ix_device_plugin.core.inventory import Inventory, carry_missing
from ix_device_plugin.deviceplugin.outputs import OutputError, _spec_yaml, write_atomically
from ix_device_plugin.dra.claims import (
    CHECKPOINT_FILE,
    CheckpointError,
    ClaimError,
    ClaimRef,
    PreparedClaim,
    cdi_spec_file,
    checkpoint_text,
    holders,
    parse_checkpoint,
    prepare,
)
from ix_device_plugin.dra.slices import (
    DRIVER,
    SliceContent,
    pcie_root,
    slice_content,
    slice_devices,
    slice_name,
    slice_object,
    taints_dropped,
)
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.devnodes import check_device_nodes, with_control_nodes
from ix_device_plugin.hardware.worker import Hardware
from ix_device_plugin.kubelet.registration import unix_target
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.runtime.probes import ProbeHandlers, ProbeServer, parse_address
from ix_device_plugin.settings.options import DraOptions

log = logging.getLogger(__name__)

REGISTRATION_SOCKET = f"{DRIVER}-reg.sock"
DRA_SOCKET = "dra.sock"
PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def plugin_dir(options: DraOptions) -> Path:
    """The driver's directory under the kubelet's plugins directory (socket and checkpoint)."""
    return options.plugins_dir / DRIVER


def registration_socket(options: DraOptions) -> Path:
    """Where the plugin watcher finds the driver."""
    return options.registrar_dir / REGISTRATION_SOCKET


def dra_socket(options: DraOptions) -> Path:
    """The DRAPlugin service's socket, the endpoint GetInfo names."""
    return plugin_dir(options) / DRA_SOCKET


def pcie_roots(inventory: Inventory, sysfs_root: Path) -> dict[str, str]:
    """The PCIe root of each chip's bus ID, resolved through `<sysfs>/bus/pci/devices/<bus id>`."""
    roots = {}
    for chip in inventory.chips():
        if not chip.bus_id:
            continue
        parts = chip.bus_id.lower().split(":")
        if len(parts) == 3 and len(parts[0]) == 8:  # IXML's 8-digit domain; sysfs has 4
            parts[0] = parts[0][-4:]
        link = sysfs_root / "bus" / "pci" / "devices" / ":".join(parts)
        root = pcie_root(os.path.realpath(link)) if link.exists() else None
        if root is not None:
            roots[chip.bus_id] = root
    return roots


# ---- prepared claims ------------------------------------------------------------------------------


class ClaimStore:
    """The prepared claims: their CDI spec files and the checkpoint, both written atomically."""

    def __init__(self, directory: Path, cdi_dir: Path) -> None:
        self.path = directory / CHECKPOINT_FILE
        self.cdi_dir = cdi_dir
        self.claims: dict[str, PreparedClaim] = {}

    def load(self) -> None:
        """Read the checkpoint; a corrupt one is moved aside (logged) and the driver starts empty."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as error:
            raise CheckpointError(f"{self.path}: {error.strerror or error}") from None
        try:
            self.claims = parse_checkpoint(text, str(self.path))
        except CheckpointError as error:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            with contextlib.suppress(OSError):
                self.path.rename(aside)
            log.error("%s; moved to %s, starting without prepared claims", error, aside)
            return
        log.info("checkpoint %s: %d prepared claims", self.path, len(self.claims))

    def add(self, claim: PreparedClaim) -> None:
        """Write claim's CDI spec, then the checkpoint with it; raises OutputError."""
        write_atomically(self.cdi_dir / cdi_spec_file(claim.ref.uid), _spec_yaml(claim.spec))
        self.claims[claim.ref.uid] = claim
        self._save()

    def remove(self, uid: str) -> bool:
        """Remove the claim's CDI spec and checkpoint entry; True when it was prepared. Raises OutputError."""
        spec = self.cdi_dir / cdi_spec_file(uid)
        try:
            spec.unlink(missing_ok=True)
        except OSError as error:
            raise OutputError(f"cannot remove {spec}: {error.strerror or error}") from None
        known = self.claims.pop(uid, None) is not None
        if known:
            self._save()
        return known

    def _save(self) -> None:
        write_atomically(self.path, checkpoint_text(self.claims))


def read_checkpoint(options: DraOptions) -> dict[str, PreparedClaim]:
    """The prepared claims in the checkpoint (for `list --dra`); raises CheckpointError."""
    path = plugin_dir(options) / CHECKPOINT_FILE
    try:
        return parse_checkpoint(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise CheckpointError(f"{path}: {error.strerror or error}") from None


# ---- the ResourceSlice ----------------------------------------------------------------------------


class SlicePublisher:
    """Keeps the node's ResourceSlice equal to the content it is given; learns whether taints are kept."""

    def __init__(self, kube: Kube, node: str) -> None:
        self.kube = kube
        self.node = node
        self.name = slice_name(node)
        self.taints: bool | None = None  # None: not known yet whether the API server keeps device taints
        self.published: dict[str, Any] | None = None

    async def publish(self, content: SliceContent, roots: Mapping[str, str]) -> None:
        """Create or update the slice; raises KubeError."""
        devices = slice_devices(content, roots, taints=self.taints is not False)
        stored = await self._write(devices)
        if self.taints is None and any("taints" in d for d in devices):
            self.taints = not taints_dropped(devices, stored)
            if self.taints:
                log.info(
                    "the API server keeps device taints: unhealthy chips are tainted %s", "gpu.iluvatar.com/unhealthy"
                )
            else:
                log.warning("the API server drops device taints (DRADeviceTaints off): unhealthy chips are left out")
                stored = await self._write(slice_devices(content, roots, taints=False))
        self.published = stored
        left_out = [d.name for d in content.devices if not d.healthy and self.taints is False]
        tainted = [d.name for d in content.devices if not d.healthy and self.taints]
        log.info(
            "ResourceSlice %s: %d devices (generation %s)%s%s",
            self.name,
            len((stored.get("spec") or {}).get("devices") or []),
            ((stored.get("spec") or {}).get("pool") or {}).get("generation"),
            f"; unhealthy, left out: {', '.join(left_out)}" if left_out else "",
            f"; unhealthy, tainted: {', '.join(tainted)}" if tainted else "",
        )

    async def _write(self, devices: list[dict[str, Any]]) -> dict[str, Any]:
        for _ in range(5):  # a conflict means someone else wrote it: read again
            current = await self.kube.get_object(RESOURCE_SLICE, self.name)
            if current is None:
                try:
                    return await self.kube.create_object(RESOURCE_SLICE, slice_object(self.node, devices, 1))
                except KubeAlreadyExists:
                    continue
            spec = current.get("spec") or {}
            generation = int((spec.get("pool") or {}).get("generation") or 0)
            wanted = slice_object(self.node, devices, generation)
            if spec == wanted["spec"]:
                return current
            wanted["spec"]["pool"]["generation"] = generation + 1
            wanted["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion", "")
            try:
                return await self.kube.replace_object(RESOURCE_SLICE, wanted)
            except KubeError as error:
                if error.status != 409:
                    raise
        raise KubeError(f"update resourceslice {self.name}: still conflicting after 5 tries", 409, "Conflict")


# ---- gRPC services --------------------------------------------------------------------------------


class RegistrationService(registration_grpc.RegistrationServicer):
    """The plugin watcher's side: who we are, and what the kubelet made of it."""

    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self.status: registration_pb2.RegistrationStatus | None = None
        self.registered = asyncio.Event()

    async def GetInfo(
        self, request: registration_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> registration_pb2.PluginInfo:
        """Type DRAPlugin, the driver, its endpoint and the DRA services it serves."""
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint), supported_versions=list(SUPPORTED_VERSIONS)
        )

    async def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> registration_pb2.RegistrationStatusResponse:
        """Log the kubelet's verdict: registered, or refused and why."""
        self.status = request
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s (endpoint %s)", DRIVER, self.endpoint)
            self.registered.set()
        else:
            log.error("the kubelet refused DRA driver %s: %s", DRIVER, request.error or "no reason given")
        return registration_pb2.RegistrationStatusResponse()


class DraService:
    """NodePrepareResources and NodeUnprepareResources in one API version (module pb2)."""

    def __init__(self, driver: DraDriver, pb2: Any, version: str) -> None:
        self.driver = driver
        self.pb2 = pb2
        self.version = version

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Prepare every claim; each answers its devices or its own error."""
        refs = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        outcomes = await asyncio.gather(*(self.driver.prepare_claim(ref) for ref in refs))
        response = self.pb2.NodePrepareResourcesResponse()
        for ref, outcome in zip(refs, outcomes, strict=True):
            answer = response.claims[ref.uid]
            if isinstance(outcome, str):
                answer.error = outcome
                continue
            for device in outcome.devices:
                answer.devices.append(
                    self.pb2.Device(
                        request_names=list(device.requests),
                        pool_name=device.pool,
                        device_name=device.device,
                        cdi_device_ids=list(device.cdi_ids),
                    )
                )
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Unprepare every claim; unknown claims are already unprepared."""
        response = self.pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            error = await self.driver.unprepare_claim(ClaimRef(claim.namespace, claim.name, claim.uid))
            response.claims[claim.uid].error = error or ""
        return response


# ---- the driver -----------------------------------------------------------------------------------


class DraDriver:
    """The DRA mode: owns the inventory, publishes the slice, serves the kubelet."""

    def __init__(self, options: DraOptions, api: ApiConnection | None = None) -> None:
        self.options = options
        base = options.base
        self.hardware = Hardware(base.backend_factory, base.call_timeout)
        self.api = api or (ApiConnection(options.kube) if options.kube is not None else None)
        self.kube: Kube | None = None
        self.store = ClaimStore(plugin_dir(options), options.cdi_spec_dir)
        self.inventory = Inventory()
        self.content = SliceContent((), None)
        self.roots: dict[str, str] = {}
        self.generation = 0  # bumped whenever content changes
        self.registration = RegistrationService(dra_socket(options))
        self.publisher: SlicePublisher | None = None
        self.ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._lock = asyncio.Lock()  # prepare and unprepare change the store one at a time
        self._servers: list[grpc.aio.Server] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._probes: ProbeServer | None = None
        self.probe_port: int | None = None
        self.metrics = CollectorRegistry(auto_describe=True)
        self.metrics.register(_DraCollector(self))

    # ---- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until stop() or a signal; the process exit code."""
        try:
            await self.start()
        except (OSError, CheckpointError, OutputError) as error:
            log.error("cannot start the DRA driver: %s", error)
            await self.shutdown()
            return 1
        await self._stopping.wait()
        await self.shutdown()
        return 0

    async def start(self) -> None:
        """Discover, load the checkpoint, serve both sockets, start publishing; raises OSError, CheckpointError."""
        started = time.perf_counter()
        self.store.load()
        await self._first_discovery()
        assert self.api is not None
        self.kube = await self.api.kube()
        self.publisher = SlicePublisher(self.kube, self.options.node_name)
        self._spawn("publish-slice", self._publish_slices())
        self._spawn("hardware", self._watch_hardware())
        await self._serve()
        await self._start_probes()
        self.ready.set()
        log.info("DRA driver %s ready in %.0f ms", DRIVER, (time.perf_counter() - started) * 1000)

    def stop(self) -> None:
        """Ask the driver to stop (safe from a signal handler)."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the driver."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop)
        loop.add_signal_handler(signal.SIGINT, self.stop)

    async def shutdown(self) -> None:
        """Stop the tasks and servers, remove the sockets, close the hardware (bounded by stop_timeout)."""
        for task in self._tasks:
            task.cancel()
        timeout = self.options.base.stop_timeout
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
        for server in self._servers:
            await server.stop(timeout / 2)
        self._servers.clear()
        if self._probes is not None:
            await self._probes.stop()
            self._probes = None
        for path in (registration_socket(self.options), dra_socket(self.options)):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        if self.api is not None:
            await self.api.close()
        await self.hardware.close(timeout)

    def _spawn(self, name: str, work: Any) -> None:
        self._tasks.append(asyncio.create_task(work, name=name))

    async def _serve(self) -> None:
        endpoint = dra_socket(self.options)
        for path in (registration_socket(self.options), endpoint):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # a stale socket of an earlier run
        dra = grpc.aio.server()
        dra_v1_grpc.add_DRAPluginServicer_to_server(DraService(self, dra_v1, "v1"), dra)  # type: ignore[arg-type]
        dra_v1beta1_grpc.add_DRAPluginServicer_to_server(DraService(self, dra_v1beta1, "v1beta1"), dra)  # type: ignore[arg-type]
        dra.add_insecure_port(unix_target(endpoint))
        await dra.start()
        self._servers.append(dra)
        registrar = grpc.aio.server()
        registration_grpc.add_RegistrationServicer_to_server(self.registration, registrar)
        registrar.add_insecure_port(unix_target(registration_socket(self.options)))
        await registrar.start()
        self._servers.append(registrar)
        log.info("serving %s and %s", registration_socket(self.options), endpoint)

    # ---- probes and metrics -------------------------------------------------------------------

    async def _start_probes(self) -> None:
        address = parse_address(self.options.base.health_address)
        if address is None:
            return
        handlers = ProbeHandlers(live=self._live, ready=self._ready, metrics=lambda: generate_latest(self.metrics))
        self._probes = ProbeServer(handlers)
        self.probe_port = await self._probes.start(*address)

    def _live(self) -> tuple[bool, str]:
        stuck = self.hardware.stuck_for()
        if stuck is not None:
            return False, f"GPU library call {stuck[0]}() has not returned for {stuck[1]:.0f}s"
        return True, f"serving DRA driver {DRIVER} for {len(self.content.devices)} chips"

    def _ready(self) -> tuple[bool, str]:
        if not self.registration.registered.is_set():
            return False, "not registered with the kubelet's plugin watcher"
        if self.publisher is None or self.publisher.published is None:
            return False, "ResourceSlice not published yet"
        return True, f"registered, ResourceSlice {self.publisher.name} published"

    # ---- the hardware: the one owner of the inventory ----------------------------------------

    async def _discover(self) -> Inventory:
        def work(backend: Any) -> Inventory:
            found = with_control_nodes(backend.discover(), self.options.base.dev_root)
            return check_device_nodes(found, self.options.base.dev_root) if backend.has_device_nodes else found

        return carry_missing(self.inventory, await self.hardware.call("discover", work))

    async def _first_discovery(self) -> None:
        backoff = Backoff(initial=min(1.0, self.options.base.health_interval), cap=30.0)
        errors = OncePerError(log, logging.ERROR)
        while True:
            try:
                self._set_inventory(await self._discover())
                errors.succeeded("GPU discovery works again")
                return
            except BackendError as error:
                errors.failed("GPU discovery failed: %s (retrying)", error)
            await backoff.sleep()

    async def _watch_hardware(self) -> None:
        base = self.options.base
        last_discovery = time.monotonic()
        errors = OncePerError(log, logging.WARNING)
        while True:
            await asyncio.sleep(base.health_interval)
            try:
                if time.monotonic() - last_discovery >= base.rediscover_interval:
                    last_discovery = time.monotonic()
                    inventory = await self._discover()
                else:
                    polled = self.inventory
                    statuses = await self.hardware.call("health", lambda backend, seen=polled: backend.health(seen))
                    inventory = polled.with_statuses(statuses)
                errors.succeeded("the GPU library answers again")
            except BackendError as error:
                errors.failed("GPU health poll failed: %s", error)
                continue
            self._set_inventory(inventory)

    def _set_inventory(self, inventory: Inventory) -> None:
        content = slice_content(inventory)
        roots = pcie_roots(inventory, self.options.base.sysfs_root)
        self.inventory = inventory
        if content == self.content and roots == self.roots:
            return
        for warning in content.warnings:
            if warning not in self.content.warnings:
                log.warning("%s", warning)
        self.content, self.roots = content, roots
        self.generation += 1
        self._changed.set()

    # ---- publishing ------------------------------------------------------------------------------

    async def _publish_slices(self) -> None:
        assert self.publisher is not None
        backoff = Backoff(initial=0.2, cap=30.0)
        errors = OncePerError(log, logging.WARNING)
        published = -1
        while True:
            if published == self.generation:
                self._changed.clear()
                await self._changed.wait()
                continue
            generation = self.generation
            try:
                await self.publisher.publish(self.content, self.roots)
            except KubeError as error:
                errors.failed("cannot publish ResourceSlice %s: %s (retrying)", self.publisher.name, error.message)
                await backoff.sleep()
                continue
            errors.succeeded("API server answering again: ResourceSlice %s published", self.publisher.name)
            backoff.reset()
            published = generation

    # ---- claims ---------------------------------------------------------------------------------

    async def prepare_claim(self, ref: ClaimRef) -> PreparedClaim | str:
        """The prepared claim, or the per-claim error message; never raises."""
        known = self.store.claims.get(ref.uid)
        if known is not None:
            return known  # prepared already (a repeated call, another pod of a shared claim, a restart)
        try:
            claim = await self._read_claim(ref)
            async with self._lock:
                known = self.store.claims.get(ref.uid)
                if known is not None:
                    return known
                prepared = prepare(
                    ref,
                    claim,
                    self.content.by_name(),
                    holders(self.store.claims),
                    self.options.node_name,
                    self.inventory.control_nodes,
                    self.options.base.dev_root,
                )
                self.store.add(prepared)
        except (ClaimError, OutputError, KubeError) as error:
            message = error.message if isinstance(error, KubeError) else str(error)
            log.warning("NodePrepareResources: %s", message)
            return message
        log.info("prepared claim %s: %s", ref, ", ".join(d.device for d in prepared.devices))
        return prepared

    async def unprepare_claim(self, ref: ClaimRef) -> str | None:
        """Remove the claim's CDI spec and checkpoint entry; the error message, or None."""
        async with self._lock:
            try:
                known = self.store.remove(ref.uid)
            except OutputError as error:
                log.warning("NodeUnprepareResources: claim %s: %s", ref, error)
                return f"claim {ref}: {error}"
        log.info("unprepared claim %s%s", ref, "" if known else " (was not prepared)")
        return None

    async def _read_claim(self, ref: ClaimRef) -> dict[str, Any]:
        assert self.kube is not None
        kube = self.kube

        async def read() -> dict[str, Any]:
            claim = await kube.get_object(RESOURCE_CLAIM, ref.name, ref.namespace)
            if claim is None:
                raise ClaimError(f"claim {ref}: no such ResourceClaim")
            return claim

        try:
            async with asyncio.timeout(self.options.claim_read_timeout):
                return await Backoff(initial=0.1, cap=2.0).retry(read, errors=OncePerError(log, logging.WARNING))
        except TimeoutError:
            raise ClaimError(
                f"claim {ref}: cannot read it from the API server within {self.options.claim_read_timeout:g}s"
            ) from None


def run_dra(options: DraOptions, run_until_done: Callable[[Any], int]) -> int:
    """Run the DRA driver until SIGTERM or SIGINT; the exit code."""

    async def serve() -> int:
        driver = DraDriver(options)
        driver.install_signal_handlers()
        return await driver.run()

    return run_until_done(serve())


class _DraCollector(Collector):
    """The DRA mode's state, read at scrape time."""

    def __init__(self, driver: DraDriver) -> None:
        self._driver = driver

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        driver = self._driver
        figures = (
            ("registered", "1 while registered with the kubelet", int(driver.registration.registered.is_set())),
            ("slice_devices", "Chips in the node's ResourceSlice", len(driver.content.devices)),
            ("prepared_claims", "ResourceClaims prepared on the node", len(driver.store.claims)),
        )
        for name, help_text, value in figures:
            yield GaugeMetricFamily(f"ix_device_plugin_dra_{name}", help_text, value=value)
