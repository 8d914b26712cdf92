"""The DRA mode (`ix-device-plugin dra`): the kubelet plugin of driver gpu.iluvatar.com and its ResourceSlice.

A thin driver, in the shape of the reference kubelet plugin: the node-agent kit (nodeagent/kit.py) runs the node's
services and hands each view of the hardware to `hardware_changed`, which turns it into the slice content; `DraState`
owns the prepared claims; the API side (`DriverApi`, driverapi.py: the slice publisher, the claims' reads and status,
the containers' teller) is built once the API client is known, and the watches of the node's slices and Node are
watches.py's. A NodePrepareResources reads each claim once (one memo per call), prepares it through the state, and has
the claims' CDI specs tell each container its chips. The kubelet reaches it through the registration service on
`<registrar dir>/gpu.iluvatar.com-reg.sock` and the DRAPlugin service (v1 and v1beta1) on
`<plugins dir>/gpu.iluvatar.com/dra.sock`.

On a clean stop the sockets are removed and the slice is kept: a restart or an upgrade does not withdraw the
chips from the scheduler, and the kubelet deletes the slices of a driver that stays unregistered (uninstall).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ix_device_plugin.apiserver.client import Kube
from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.settings import KubeSettings
from ix_device_plugin.core.healing import Rules
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.labels import LabelSet
from ix_device_plugin.dra.agentmode import dra_mode
from ix_device_plugin.dra.apireads import ClaimMemo
from ix_device_plugin.dra.chipguard import ClaimGuard
from ix_device_plugin.dra.driverapi import DriverApi
from ix_device_plugin.dra.health import DeviceHealthBoard
from ix_device_plugin.dra.kubeletsockets import KubeletSockets
from ix_device_plugin.dra.metrics import DraMetrics
from ix_device_plugin.dra.nodeservices import DraNodeGauges, claim_holders, dra_label_set
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim
from ix_device_plugin.dra.publisher import SlicePublisher
from ix_device_plugin.dra.registration import (
    RegistrationService,
    dra_socket,
    plugin_dir,
    registration_socket,
    socket_paths_problem,
)
from ix_device_plugin.dra.served import Served
from ix_device_plugin.dra.slices import BOARD, DRIVER, SliceContent, SlicePolicy
from ix_device_plugin.dra.state import DraState
from ix_device_plugin.dra.watches import node_watches
from ix_device_plugin.gpureset.outcome import GpuResetError
from ix_device_plugin.gpureset.purpose import CLAIM_RESET, resetting_for
from ix_device_plugin.hardware.monitor import HardwareView
from ix_device_plugin.hardware.open import BackendFactory
from ix_device_plugin.hardware.open import backend_factory as open_backend
from ix_device_plugin.nodeagent.kit import NodeAgent, NodeParts
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.files import read_boot_id
from ix_device_plugin.runtime.probes import ProbeHandlers
from ix_device_plugin.runtime.service import Service
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.health import HealthPolicy
from ix_device_plugin.settings.options import DraOptions
from ix_device_plugin.telemetry.holders import ClaimHolders

log = logging.getLogger(__name__)

METADATA_POLL = 1.0  # seconds between looks for the monitor's first view while the device metadata waits for it
Guard = ClaimGuard  # the driver's chip guard


class DraDriver:
    """The DRA mode: follows the hardware monitor, publishes the slice, serves the kubelet.

    kube: a connected API client, else the one connection made from kube_settings (at start);
    backend_factory: the GPUs' backend (default: the one options name); healing_rules: how hard self-healing tries.
    """

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
        self.api_side: DriverApi | None = None  # built at start, once the API client is known
        policy = SlicePolicy(options.config.splitboard, options.config.replicas)
        self.served = Served(policy, self.health_policy, base.sysfs_root)
        self.endpoint = dra_socket(options.plugins_dir, options.pod_uid)
        self.registrar_socket = registration_socket(options.registrar_dir, options.pod_uid)
        self.health = DeviceHealthBoard(options.node_name)
        self._streams_end = asyncio.Event()
        self.registration = RegistrationService(self.endpoint, self._registered)
        self.ready = asyncio.Event()
        self.sockets = KubeletSockets(self.registrar_socket, self.endpoint)
        self.metrics = DraMetrics(self._figures, self._prepared_devices)
        boot_id = read_boot_id(options.boot_id_path)
        factory, mode = backend_factory or open_backend(base), dra_mode(options, boot_id, healing_rules)
        self._boot_id = boot_id
        self.node: NodeAgent[ClaimGuard] = NodeAgent(base, mode, self, self.metrics, factory, self.api)
        node = self.node
        self.gauges = DraNodeGauges(lambda: node.inventory, lambda: self.content, self.metrics, self.registration,
                                    lambda: node.acting)  # fmt: skip

    # ---- what the node agent asks of the driver (nodeagent.frontend.FrontEnd) -------------------

    def chip_guard(self, parts: NodeParts) -> Guard:
        """The driver's chip guard: its claims (the state, built here with the node's reset turn and the chips its
        record reserves), and pod-resources."""
        record = parts.record
        self.state = DraState(
            plugin_dir(self.options.plugins_dir), self.options.cdi_spec_dir, self.options.node_name,
            self.options.base.dev_root, self._boot_id, parts.reset_turn,
            reserved=record.reserved_now if record is not None else dict, facts=self.served.facts,
        )  # fmt: skip
        return ClaimGuard(self.state, parts.pod_resources, lambda: parts.monitor.inventory)

    def chip_holders(self, parts: NodeParts) -> ClaimHolders:
        """Who holds each chip: the claims prepared on it, and the device plugin's pods from before the move."""
        monitor = parts.monitor
        return claim_holders(parts.pod_resources, self.options, lambda: self.content, lambda: monitor.inventory)

    def node_labels(self, machine: str | None) -> LabelSet:
        """The node's labels for the chips it has and the devices the driver serves now."""
        return dra_label_set(self.node.inventory, self.options.config, self.content, machine)

    def announces_reset(self) -> bool:
        """A claim may ask for a reset at any time: the ConfigMap says at start that we hold the GPUs."""
        return True

    def current_health_policy(self) -> HealthPolicy:
        """The health policy read at start, with IX_DISABLE_HEALTHCHECKS."""
        return self.health_policy

    def self_healing_switch(self) -> str:
        """selfHealing as read at start."""
        return self.options.config.self_healing

    @property
    def config(self) -> Config:
        """The configuration as read at start."""
        return self.options.config

    async def rediscover(self) -> Inventory:
        """Discover again after a GPU reset."""
        return (await self.node.rediscover()).inventory

    @property
    def policy(self) -> SlicePolicy:
        """How the chips are offered (splitboard, replicas), as read at start."""
        return self.content.policy

    @property
    def inventory(self) -> Inventory:
        """The inventory the slice describes."""
        return self.node.inventory

    @property
    def publisher(self) -> SlicePublisher | None:
        """The slice publisher, once the API client is known (at start)."""
        return self.api_side.publisher if self.api_side is not None else None

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
        # The role first: the record's restore says what is wrong only when acting. A lock file that cannot serve is
        # said; the role's task tries again.
        await self.node.start(self.options.config.fail_on_init_error)
        if self.kube is None:
            assert self.api is not None
            self.kube = await self.api.kube()
        boards = any(device.kind == BOARD for claim in self.state.claims.values() for device in claim.devices)
        served, node = self.served, self.options.node_name
        wanted = (served.content, served.roots)
        api_side = self.api_side = DriverApi(
            self.kube, node, self.state, self.options.claim_read_timeout, wanted, counters=boards
        )
        api = self.api
        watches = node_watches(api, node, self._slices_seen, self._node_seen) if api is not None else {}
        duties = {"publish-slice": api_side.publisher.run, "device-metadata": self._keep_metadata}  # acting only
        for name, task in {**watches, **self.node.tasks(duties)}.items():
            self.service.spawn(name, task)
        await self._serve()
        await self.node.start_probes(ProbeHandlers(live=self._live, ready=self._ready, metrics=self.metrics.render))
        self.ready.set()
        log.info("DRA driver %s ready in %.0f ms", DRIVER, (time.perf_counter() - started) * 1000)

    async def shutdown(self) -> None:
        """Stop the tasks and servers, remove the sockets, close the hardware (bounded by stop_timeout)."""
        timeout = self.options.base.stop_timeout
        self._streams_end.set()
        await self.service.stop_tasks(timeout * 0.4)
        if self.api_side is not None:
            await self.api_side.close(timeout / 10)
        await self.state.close(timeout / 10)
        await self.sockets.stop_servers(timeout / 4)
        self.sockets.remove_sockets()
        await self.node.stop(timeout)  # the role is let go already when the publisher stopped; here when abandoned

    async def _serve(self) -> None:
        dirs = (self.options.registrar_dir, self.options.plugins_dir)
        claims = (self.prepare_claims, self.unprepare_claim)
        await self.sockets.serve(dirs, claims, self.health, self._streams_end, self.registration)

    def _node_seen(self, uid: str, chips_to_return: str) -> None:
        if self.publisher is not None:
            self.publisher.node_seen(uid)
        self.node.return_seen(chips_to_return)

    def _slices_seen(self, stored: Mapping[str, str]) -> None:
        if self.publisher is not None:
            self.publisher.seen(stored)

    def _registered(self) -> None:
        """The kubelet (re)registered us: it deletes a node's slices when it starts, so publish them again."""
        if self.publisher is not None:
            self.publisher.republish()

    # ---- the hardware, as the monitor sees it -------------------------------------------------

    def hardware_changed(self, view: HardwareView) -> None:
        """A new view of the hardware: what is served, the health stream, the publisher and the node labels follow,
        in that order (the labels read the new content)."""
        if not self.served.take(view):
            return
        self.health.update(self.content)
        if self.publisher is not None:
            self.publisher.want(self.content, self.served.roots)
        self.node.labels_changed()

    @property
    def content(self) -> SliceContent:
        """The slice content served now."""
        return self.served.content

    async def _keep_metadata(self) -> None:
        """While this pod acts for the node (publishing its slices): bring the prepared claims' device metadata up to
        date when what the node says of its devices changes (health, a reset, a hot-plug): one writer at a time, and
        the new pod of an update writes what it publishes once it takes over."""
        served = self.served
        while not served.known:
            await asyncio.sleep(METADATA_POLL)
        while True:
            served.changed.clear()
            await self.state.refresh_metadata(served.facts())
            await served.changed.wait()

    # ---- claims ---------------------------------------------------------------------------------

    async def prepare_claims(self, refs: Sequence[ClaimRef]) -> list[PreparedClaim | str]:
        """Prepare the claims of one NodePrepareResources (the kubelet asks for all of a pod's claims at once),
        then have the claims' CDI specs tell each container of the pods using them what it holds; each claim's
        outcome (see prepare_claim)."""
        api_side = self._api_side()
        memo = api_side.memo()  # each claim as read for this call
        outcomes = list(await asyncio.gather(*(self.prepare_claim(ref, memo) for ref in refs)))
        prepared = {outcome.ref.uid for outcome in outcomes if not isinstance(outcome, str)}
        if seeds := {uid: claim for uid, claim in memo.read.items() if uid in prepared}:
            await api_side.tell(seeds)
        # answered as told: a claim of this call may now have a relay among its devices' CDI IDs (containers.py)
        return [o if isinstance(o, str) else self.state.claims.get(o.ref.uid, o) for o in outcomes]

    async def prepare_claim(self, ref: ClaimRef, memo: ClaimMemo | None = None) -> PreparedClaim | str:
        """The prepared claim, or the per-claim error message; never raises. memo: the claims read for this call
        (a fresh one by default)."""
        api_side = self._api_side()
        memo = memo or api_side.memo()
        devices, control_nodes = self.content.by_name(), self.inventory.control_nodes
        work = self.state.prepare(ref, memo, devices, control_nodes, self._reset_claim)
        prepared: PreparedClaim | str = await self.metrics.timed("prepare", work)
        if not isinstance(prepared, str):  # the status write starts from the claim as this prepare read it
            bus_ids = {chip.uuid: chip.bus_id for chip in self.inventory.chips()}
            api_side.prepared(prepared, bus_ids, memo.read.get(ref.uid))
        return prepared

    async def unprepare_claim(self, ref: ClaimRef) -> str | None:
        """Remove the claim's CDI spec and checkpoint entry; the error message, or None."""
        error: str | None = await self.metrics.timed("unprepare", self.state.unprepare(ref))
        if error is None:
            self._api_side().unprepared(ref)
            self.node.chips_freed()  # a chip waiting to be reset may be free now
        return error

    async def _reset_claim(self, claim: PreparedClaim) -> str | None:
        """Reset the chips of a claim configured with reset: true (None), or say why that failed."""
        try:
            with resetting_for(CLAIM_RESET):
                await self.node.reset(claim.reset_chips)
        except GpuResetError as error:
            return f"GPU reset before the container starts: {error}"
        return None

    def _api_side(self) -> DriverApi:
        """The API side, built at start: the kubelet is served only after it."""
        if self.api_side is None:
            raise RuntimeError("the DRA driver serves claims only once started")
        return self.api_side

    # ---- probes and metrics -------------------------------------------------------------------

    def _live(self) -> tuple[bool, str]:
        problem = self.node.problem()
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
