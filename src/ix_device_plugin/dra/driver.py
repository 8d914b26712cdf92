"""The DRA mode (`ix-device-plugin dra`): the kubelet plugin of driver gpu.iluvatar.com and its ResourceSlice.

Composed on the same spine as the device plugin: the shared hardware monitor tells the driver what the node
has (each view becomes the slice content the publisher keeps in the API server), the runtime skeleton runs
and stops it, `DraState` owns the prepared claims, and `ContainerTeller` (teller.py) has their CDI specs tell
each container its chips once a NodePrepareResources is done. The kubelet reaches it through the registration
service on `<registrar dir>/gpu.iluvatar.com-reg.sock` and the DRAPlugin service (v1 and v1beta1) on
`<plugins dir>/gpu.iluvatar.com/dra.sock`.

On a clean stop the sockets are removed and the slice is kept: a restart or an upgrade does not withdraw the
chips from the scheduler, and the kubelet deletes the slices of a driver that stays unregistered (uninstall).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ix_device_plugin.apiserver.client import Kube
from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.objects import NODE, RESOURCE_SLICE, uid_of
from ix_device_plugin.apiserver.settings import KubeSettings
from ix_device_plugin.apiserver.watch import Key, Mirror
from ix_device_plugin.core.healing import ResetLimit, Rules
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.dra.agentmode import dra_mode
from ix_device_plugin.dra.apireads import ApiReads
from ix_device_plugin.dra.claimstatus import ClaimStatusWriter
from ix_device_plugin.dra.healguard import ClaimGuard
from ix_device_plugin.dra.health import DeviceHealthBoard
from ix_device_plugin.dra.kubeletsockets import KubeletSockets
from ix_device_plugin.dra.metadata import NodeFacts
from ix_device_plugin.dra.metrics import DraMetrics
from ix_device_plugin.dra.nodeservices import DraNodeServices, claim_holders
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim
from ix_device_plugin.dra.publisher import SlicePublisher, StoredSlice, stored_slice
from ix_device_plugin.dra.registration import (
    RegistrationService,
    dra_socket,
    plugin_dir,
    registration_socket,
    reset_turn,
    socket_paths_problem,
)
from ix_device_plugin.dra.slices import BOARD, DRIVER, SliceContent, SlicePolicy, slice_content
from ix_device_plugin.dra.state import ClaimReader, DraState
from ix_device_plugin.dra.teller import ContainerTeller
from ix_device_plugin.gpureset.outcome import GpuResetError
from ix_device_plugin.gpureset.purpose import CLAIM_RESET, resetting_for
from ix_device_plugin.hardware.monitor import HardwareMonitor, HardwareView
from ix_device_plugin.hardware.open import BackendFactory
from ix_device_plugin.hardware.open import backend_factory as open_backend
from ix_device_plugin.hardware.pcie import pcie_roots
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.healing.wayback import return_annotation
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.nodeagent.kit import NodeAgent
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.files import read_boot_id
from ix_device_plugin.runtime.probes import ProbeHandlers
from ix_device_plugin.runtime.service import Service, bounded
from ix_device_plugin.settings.health import HealthPolicy
from ix_device_plugin.settings.options import DraOptions
from ix_device_plugin.telemetry.holders import ClaimHolders

log = logging.getLogger(__name__)

METADATA_POLL = 1.0  # seconds between looks at the publisher role while the device metadata waits for it
Guard = ClaimGuard  # the driver's chip guard


class DraDriver:
    """The DRA mode: follows the hardware monitor, publishes the slice, serves the kubelet.

    kube: a connected API client, else the one connection made from kube_settings (at start);
    backend_factory: the GPUs' backend (default: the one options name); healing_rules: how hard self-healing tries.
    """

    publisher: SlicePublisher | None = None  # made at start, with the API client
    claim_status: ClaimStatusWriter | None = None

    def __init__(
        self,
        options: DraOptions,
        kube: Kube | None = None,
        *,
        kube_settings: KubeSettings | None = None,
        backend_factory: BackendFactory | None = None,
        healing_rules: Rules | None = None,
    ) -> None:
        self.options = options
        base = options.base
        self.service = Service(base.stop_timeout)
        self.health_policy = options.config.health_policy.with_disabled(base.ignored_health_errors)
        self.kube = kube
        self.api = ApiConnection(kube_settings) if kube_settings is not None else None
        self.state = DraState(
            plugin_dir(options.plugins_dir), options.cdi_spec_dir, options.node_name, base.dev_root,
            read_boot_id(options.boot_id_path), reset_turn(options.plugins_dir, base.reset_wait_timeout),
            reserved=self._reserved, facts=self.facts,
        )  # fmt: skip
        self.content = SliceContent((), None, policy=SlicePolicy(options.config.splitboard, options.config.replicas))
        self.roots: dict[str, str] = {}  # PCIe roots by chip UUID, as the slice says them
        self.endpoint = dra_socket(options.plugins_dir, options.pod_uid)
        self.registrar_socket = registration_socket(options.registrar_dir, options.pod_uid)
        self.health = DeviceHealthBoard(options.node_name)
        self._streams_end = asyncio.Event()
        self.registration = RegistrationService(self.endpoint, self._registered)
        self.ready = asyncio.Event()
        self.reads: ApiReads | None = None  # from start, with the API client
        self.teller: ContainerTeller | None = None  # the same
        self.sockets = KubeletSockets(self.registrar_socket, self.endpoint)
        self.metrics = DraMetrics(self._figures, self._prepared_devices)
        factory, mode = backend_factory or open_backend(base), dra_mode(options, self.state.boot_id, healing_rules)
        self.node: NodeAgent[ClaimGuard] = NodeAgent(base, mode, self, self.metrics, factory, self.api)
        monitor = self.node.monitor
        monitor.subscribe(self._hardware_changed)  # first: the node labels' subscriber reads the new content
        self.node_labels = DraNodeServices(options, monitor, lambda: self.content, self.metrics, self.registration)
        self._facts_changed = asyncio.Event()  # what the node says of its devices changed since metadata was written
        self._facts_seen = False  # the monitor has given a view: the facts are the node's, not empty

    # ---- what the node agent asks of the driver (nodeagent.kit.FrontEnd) ------------------------

    def chip_guard(self, pod_resources: PodResources, monitor: HardwareMonitor, record: RecordFile | None) -> Guard:
        """The driver's chip guard: its claims, pod-resources, and the driver's reset lock."""
        return ClaimGuard(self.state, pod_resources, lambda: monitor.inventory)

    def chip_holders(self, pod_resources: PodResources, monitor: HardwareMonitor) -> ClaimHolders:
        """Who holds each chip: the claims prepared on it, and the device plugin's pods from before the move."""
        return claim_holders(pod_resources, self.options, lambda: self.content, lambda: monitor.inventory)

    def current_health_policy(self) -> HealthPolicy:
        """The health policy read at start, with IX_DISABLE_HEALTHCHECKS."""
        return self.health_policy

    def self_healing_switch(self) -> str:
        """selfHealing as read at start."""
        return self.options.config.self_healing

    def current_reset_limit(self) -> ResetLimit:
        """The reset limit as read at start."""
        return ResetLimit(self.options.config.reset_limit, self.options.config.reset_window)

    async def rediscover(self) -> Inventory:
        """Discover again after a GPU reset."""
        return (await self.node.monitor.rediscover()).inventory

    @property
    def policy(self) -> SlicePolicy:
        """How the chips are offered (splitboard, replicas), as read at start."""
        return self.content.policy

    @property
    def inventory(self) -> Inventory:
        """The inventory the slice describes."""
        return self.node.monitor.inventory

    # ---- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until stop() or a signal; the process exit code."""
        return await self.service.run(self.start, self.shutdown)

    def stop(self) -> None:
        """Ask the driver to stop (safe from a signal handler)."""
        self.service.stop()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the driver."""
        self.service.install_signal_handlers()

    async def start(self) -> None:
        """Read ix-config, load the checkpoint, discover, serve both sockets, publish; raises StartupError."""
        if problem := socket_paths_problem((self.registrar_socket, self.endpoint)):
            raise StartupError(problem)
        started = time.perf_counter()
        await self.state.restore()
        # First: the record's restore says what is wrong only when acting. A lock file that cannot serve is said;
        # the publish task tries again.
        publishing = self.node.take_role_at_start()
        self.node.healing.healer.restore()  # before the first discovery: a chip out of service is so from the start
        await self.node.start_monitor(self.options.config.fail_on_init_error, xids=publishing)  # standby: the record's
        if self.kube is None:
            assert self.api is not None
            self.kube = await self.api.kube()
        self.publisher = SlicePublisher(self.kube, self.options.node_name)
        if any(device.kind == BOARD for claim in self.state.claims.values() for device in claim.devices):
            self.publisher.counters = True  # a board was allocated here: the server keeps counters (after a reboot
            # the kubelet has deleted the slices, and chips alone would look free beside the allocated board)
        self.publisher.want(self.content, self.roots)
        self.claim_status = ClaimStatusWriter(self.kube, self.options.node_name)
        self.reads = ApiReads(self.kube, self.options.claim_read_timeout)
        self.teller = ContainerTeller(self.state, self.reads)
        publisher = self.publisher  # writes only while this pod holds the role (one pod of the driver at a time)
        self.service.spawn("publish-slice", self.node.act(lambda: self._publish(publisher)))
        if self.api is not None:
            self._watch_slices_and_node(self.api)
        self.service.spawn("hardware", self.node.monitor.run)
        for name, task in {**self.node_labels.tasks(), **self.node.tasks()}.items():
            self.service.spawn(name, task)
        self.service.spawn("device-metadata", self._keep_metadata)
        await self._serve()
        if self.api is not None:  # reset: false in ix-gpu-reset-<node>, as the device plugin says at start: a driver
            # killed in the middle of a reset left reset: true, and ix-exporter stays away from the GPUs until then
            self.service.spawn("reset-record", self._keep_reset_record)
        await self.node.start_probes(ProbeHandlers(live=self._live, ready=self._ready, metrics=self.metrics.render))
        self.ready.set()
        log.info("DRA driver %s ready in %.0f ms", DRIVER, (time.perf_counter() - started) * 1000)

    async def _publish(self, publisher: SlicePublisher) -> None:
        """While this pod publishes the node's slices: it listens for XIDs too (a pod on standby learns them from
        the node-health record, so that the library's XIDs all reach the pod acting for the node)."""
        await self.node.monitor.watch_xids()
        await publisher.run()

    async def shutdown(self) -> None:
        """Stop the tasks and servers, remove the sockets, close the hardware (bounded by stop_timeout)."""
        timeout = self.options.base.stop_timeout
        self._streams_end.set()
        await self.service.stop_tasks(timeout * 0.4)
        if self.claim_status is not None:
            await bounded("writing claim status", self.claim_status.close(), timeout / 10)
        await self.state.close(timeout / 10)
        await self.node.gpu_reset.close(timeout / 10)
        await self.node.healing.close(timeout / 10)
        await self.sockets.stop_servers(timeout / 4)
        await self.node.stop_probes(timeout / 10)
        self.sockets.remove_sockets()
        if self.api is not None:
            await bounded("closing the API connection", self.api.close(), timeout / 10)
        self.node_labels.close()
        await self.node.close()  # the role is let go already when the publisher stopped; here when that was abandoned

    async def _serve(self) -> None:
        dirs = (self.options.registrar_dir, self.options.plugins_dir)
        claims = (self.prepare_claims, self.unprepare_claim)
        await self.sockets.serve(dirs, claims, self.health, self._streams_end, self.registration)

    def _watch_slices_and_node(self, api: ApiConnection) -> None:
        """Watch the node's slices (put back when someone else changes or deletes them) and the Node (its UID owns
        them): one watch each, listed by field selector, so that a Node that is not there yet costs no polling."""
        node = self.options.node_name
        slices = Mirror(
            api,
            RESOURCE_SLICE,
            lambda obj: stored_slice(obj, node),
            f"the ResourceSlices of node {node}",
            field_selector={"spec.nodeName": node},
            on_change=self._slices_changed,
        )
        self.service.spawn("watch-slices", slices.run)
        owner = Mirror(
            api, NODE, _uid_and_return, f"node {node}", field_selector={"metadata.name": node},
            on_change=self._node_changed,
        )  # fmt: skip
        self.service.spawn("watch-node", owner.run)

    def _node_changed(self, nodes: Mapping[Key, tuple[str, str]]) -> None:
        uid, chips_to_return = next(iter(nodes.values()), ("", ""))
        if self.publisher is not None:
            self.publisher.node_seen(uid)
        if (requests := self.node.healing.requests) is not None:
            requests.seen(chips_to_return)

    def _slices_changed(self, stored: Mapping[Key, StoredSlice]) -> None:
        if self.publisher is not None:
            self.publisher.seen({name: s.version for (_, name), s in stored.items() if s.ours})

    def _registered(self) -> None:
        """The kubelet (re)registered us: it deletes a node's slices when it starts, so publish them again."""
        if self.publisher is not None:
            self.publisher.republish()

    # ---- the hardware, as the monitor sees it -------------------------------------------------

    def _hardware_changed(self, view: HardwareView) -> None:
        content = slice_content(view.inventory, self.health_policy, self.policy)
        roots = pcie_roots(view.inventory, self.options.base.sysfs_root)
        if content == self.content and roots == self.roots:
            return
        for warning in content.warnings:
            if warning not in self.content.warnings:
                log.warning("%s", warning)
        self.content, self.roots = content, roots
        self._facts_seen = True
        self._facts_changed.set()
        self.health.update(content)
        if self.publisher is not None:
            self.publisher.want(content, roots)

    def facts(self) -> NodeFacts:
        """What the node publishes of its devices now, as the claims' device metadata says it."""
        return NodeFacts(self.content, self.roots, known=self._facts_seen)

    async def _keep_metadata(self) -> None:
        """Bring the prepared claims' device metadata up to date when what the node says of its devices changes
        (health, a reset, a hot-plug), from the pod that publishes the node's slices: one writer at a time, and
        the new pod of an update writes what it publishes once it takes over."""
        as_holder = False
        while True:
            if not self.node.acting or not self._facts_seen:
                as_holder = False
                await asyncio.sleep(METADATA_POLL)
                continue
            if self._facts_changed.is_set() or not as_holder:
                self._facts_changed.clear()
                as_holder = True
                await self.state.refresh_metadata(self.facts())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(METADATA_POLL):
                    await self._facts_changed.wait()

    # ---- claims ---------------------------------------------------------------------------------

    async def prepare_claims(self, refs: Sequence[ClaimRef]) -> list[PreparedClaim | str]:
        """Prepare the claims of one NodePrepareResources (the kubelet asks for all of a pod's claims at once),
        then have the claims' CDI specs tell each container of the pods using them what it holds; each claim's
        outcome (see prepare_claim)."""
        read: dict[str, Any] = {}  # claim UID -> the ResourceClaim, as read for this call

        async def reader(ref: ClaimRef) -> dict[str, Any]:
            read[ref.uid] = await self._read_claim(ref)
            return read[ref.uid]

        outcomes = list(await asyncio.gather(*(self.prepare_claim(ref, reader) for ref in refs)))
        prepared = {outcome.ref.uid for outcome in outcomes if not isinstance(outcome, str)}
        seeds = {uid: claim for uid, claim in read.items() if uid in prepared}
        if seeds:
            assert self.teller is not None
            await self.teller.tell(seeds)
        # answered as told: a claim of this call may now have a relay among its devices' CDI IDs (containers.py)
        return [o if isinstance(o, str) else self.state.claims.get(o.ref.uid, o) for o in outcomes]

    async def prepare_claim(self, ref: ClaimRef, read: ClaimReader | None = None) -> PreparedClaim | str:
        """The prepared claim, or the per-claim error message; never raises. read: how to read the claim."""
        devices, control_nodes = self.content.by_name(), self.inventory.control_nodes
        as_read: dict[str, dict[str, Any]] = {}  # the claim as this prepare read it: the status write starts there

        async def reading(claim: ClaimRef) -> dict[str, Any]:
            as_read[claim.uid] = found = await (read or self._read_claim)(claim)
            return found

        work = self.state.prepare(ref, reading, devices, control_nodes, self._reset_claim)
        prepared: PreparedClaim | str = await self.metrics.timed("prepare", work)
        if not isinstance(prepared, str) and self.claim_status is not None:
            bus_ids = {chip.uuid: chip.bus_id for chip in self.inventory.chips()}
            self.claim_status.prepared(prepared, bus_ids, as_read.get(ref.uid))
        return prepared

    async def unprepare_claim(self, ref: ClaimRef) -> str | None:
        """Remove the claim's CDI spec and checkpoint entry; the error message, or None."""
        error: str | None = await self.metrics.timed("unprepare", self.state.unprepare(ref))
        if error is None and self.claim_status is not None:
            self.claim_status.unprepared(ref)
        if error is None:
            self.node.healing.healer.wake()  # a chip waiting to be reset may be free now
        return error

    async def _reset_claim(self, claim: PreparedClaim) -> str | None:
        """Reset the chips of a claim configured with reset: true (None), or say why that failed."""
        try:
            with resetting_for(CLAIM_RESET):
                await self.node.gpu_reset.reset(claim.reset_chips)
        except GpuResetError as error:
            return f"GPU reset before the container starts: {error}"
        return None

    def _reserved(self) -> dict[str, str]:
        """Chips reserved for a reset by any pod of the driver: the node-health record, read now (the last good one
        this pod read while it is gone or spoiled, until the pod acting for the node writes it again)."""
        record = None if self.node.record is None else self.node.record.known()
        return {} if record is None else record.reserved()

    async def _keep_reset_record(self) -> None:
        assert self.api is not None
        await self.node.gpu_reset.keep_record(self.api.backoff())

    async def _read_claim(self, ref: ClaimRef) -> dict[str, Any]:
        """The ResourceClaim, retried for claim_read_timeout; ClaimError naming the claim when it cannot be read."""
        assert self.reads is not None
        return await self.reads.claim(ref)

    # ---- probes and metrics -------------------------------------------------------------------

    def _live(self) -> tuple[bool, str]:
        problem = self.node.monitor.problem()
        if problem is None and (down := self.service.down()):
            problem = "; ".join(down)
        if problem is not None:
            return False, problem
        return True, f"serving DRA driver {DRIVER} for {len(self.content.devices)} devices"

    def _figures(self) -> dict[str, float]:
        publisher = self.publisher
        return {
            "registered": int(self.registration.registered.is_set()),
            "slice_devices": len(self.content.devices),
            "prepared_claims": len(self.state.claims),
            "restored_claims": self.state.restored,
            "health_changes": self.health.changes,
            "slice_repairs": publisher.repairs if publisher is not None else 0,
            "slice_publisher": int(self.node.acting),
        }

    def _prepared_devices(self) -> dict[tuple[str, str], int]:
        """Prepared devices by (type, how held: whole, share or admin)."""
        counts: dict[tuple[str, str], int] = {}
        for claim in self.state.claims.values():
            for device in claim.devices:
                held = "admin" if device.admin else "share" if device.share_id else "whole"
                counts[(device.kind, held)] = counts.get((device.kind, held), 0) + 1
        return counts

    def _ready(self) -> tuple[bool, str]:
        """Ready once the kubelet can use this pod. A pod on standby is ready: during a rolling update
        (maxUnavailable 0) the old pod, which publishes, is deleted only once the new one is ready."""
        if not self.registration.registered.is_set():
            return False, "not registered with the kubelet's plugin watcher"
        if not self.node.acting:
            node = self.options.node_name
            return True, f"registered; standby: another pod of this driver publishes the slices of node {node}"
        if self.publisher is None or self.publisher.published is None:
            return False, "ResourceSlice not published yet"
        if missing := self.publisher.missing():
            return False, f"ResourceSlice {', '.join(missing)} missing (being published again)"
        return True, f"registered, ResourceSlice {self.publisher.name} published"


def run_dra(options: DraOptions, kube: KubeSettings, run_until_done: Callable[[Any], int]) -> int:
    """Run the DRA driver until SIGTERM or SIGINT; the exit code."""

    async def serve() -> int:
        driver = DraDriver(options, kube_settings=kube)
        driver.install_signal_handlers()
        return await driver.run()

    return run_until_done(serve())


def _uid_and_return(node: Mapping[str, Any]) -> tuple[str, str]:
    """What the driver follows of its Node: its UID (the slices' owner) and the operator's iluvatar.com/gpu.return."""
    return uid_of(node), return_annotation(node)
