"""The API features that Allocate waits for, flags.reset_gpu and flags.usevolcano, and their background passes.

The passes: the reset handshake's record at start, Volcano's ConfigMap and pod annotations.

A shell over the daemon's Current state: it reads the plan and config there and changes nothing in it; the GPU
reset service it asks is the node agent's (nodeagent/kit.py), built once for the node's other resets too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from ix_device_plugin.api import api_pb2
from ix_device_plugin.core.allocation import AllocationError
from ix_device_plugin.core.inventory import Chip
from ix_device_plugin.core.plan import Plan
from ix_device_plugin.deviceplugin.state import Current, first_set
from ix_device_plugin.gpureset.outcome import GpuResetError
from ix_device_plugin.gpureset.purpose import RESET_GPU, resetting_for
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.table import DEFAULT_VOLCANO_FIELD_MANAGER

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.deviceplugin.features.volcano import VolcanoMode
    from ix_device_plugin.gpureset.service import ResetService

log = logging.getLogger(__name__)

SETTLE = 0.2  # the kubelet records an allocation just after Allocate returns
CONFIG_POLL = 5.0  # seconds between looks at whether flags.reset_gpu was turned on
PodDevices = Callable[[], Awaitable[Mapping[tuple[str, str], list[str]]]]


class ApiFeatures:
    """GPU reset and Volcano mode, on for as long as the current config says so; gpu_reset: the node's reset
    service; api: the process's API server connection (None: Volcano mode cannot answer)."""

    def __init__(
        self,
        current: Current,
        gpu_reset: ResetService,
        pod_devices: PodDevices,
        api: ApiConnection | None = None,
        acting: Callable[[], bool] = lambda: True,
        volcano_field_manager: str = DEFAULT_VOLCANO_FIELD_MANAGER,
    ) -> None:
        self._api = api
        self._volcano_field_manager = volcano_field_manager  # whose Volcano annotations are believed
        self._acting = acting  # Volcano's ConfigMap and pod annotations are written by the pod acting for the node
        self._current = current
        self._pod_devices = pod_devices
        self.gpu_reset = gpu_reset  # the node agent's: Allocate asks it for flags.reset_gpu
        self._volcano: VolcanoMode | None = None
        self._volcano_soon = asyncio.Event()

    @property
    def _config(self) -> Config:
        return self._current.state.config

    async def before_allocate(self, plan: Plan, request: api_pb2.AllocateRequest) -> api_pb2.AllocateRequest | None:
        """With flags.usevolcano, the devices Volcano chose; with flags.reset_gpu, reset their chips first.
        The request to answer, or None when neither is on."""
        config = self._config
        if not config.use_volcano and not config.reset_gpu:
            return None
        if config.use_volcano:
            from ix_device_plugin.apiserver.errors import KubeError
            from ix_device_plugin.apiserver.settings import KubeConfigError

            try:
                request = await self._volcano_request(request)
            except (KubeError, KubeConfigError) as error:
                raise AllocationError(f"Volcano mode: {error}", unavailable=True) from None
        if config.reset_gpu:
            current = self._current.plan
            chips = {chip.uuid for req in request.container_requests for chip in chips_of(current, req.devices_ids)}
            try:
                with resetting_for(RESET_GPU):
                    async with self.gpu_reset.node_turn():  # another pod of the plugin may answer Allocate too
                        await self.gpu_reset.reset(sorted(chips))
            except (GpuResetError, OutputError) as error:
                raise AllocationError(f"GPU reset before Allocate: {error}", unavailable=True) from None
        return request

    async def follow_reset_flag(self) -> None:
        """With flags.reset_gpu, say in ix-gpu-reset-<node> that we hold the GPUs whenever it is turned on, as
        upstream does (the node-agent kit keeps the ConfigMap in order: GpuReset.keep_record). For ever (cancel to
        stop)."""
        while True:
            if self._config.reset_gpu:
                self.gpu_reset.want_record()
            await asyncio.sleep(CONFIG_POLL)

    # ---- flags.usevolcano ---------------------------------------------------------------------

    async def _volcano_request(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateRequest:
        """The request with each container's devices replaced by those Volcano chose for its pod."""
        mode = await self._volcano_mode()
        chosen = [await mode.chosen_devices(list(req.devices_ids)) for req in request.container_requests]
        self._volcano_soon.set()  # annotate the pod as soon as the kubelet reports it
        return api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in chosen]
        )

    async def _volcano_mode(self) -> VolcanoMode:
        if self._volcano is not None:
            return self._volcano
        from ix_device_plugin.deviceplugin.features.volcano import VolcanoMode  # loaded once flags.usevolcano is on

        if self._api is None:
            raise AllocationError(
                "flags.usevolcano needs API access: NODE_NAME and a service account (chart: "
                "features.volcano=true) or --kubeconfig",
                unavailable=True,
            )
        self._volcano = VolcanoMode(
            self._api, lambda: self._current.plan, self._pod_devices, self._volcano_field_manager
        )
        return self._volcano

    async def run_volcano(self) -> None:
        """While flags.usevolcano is on: follow the node's pods and ix-device-info-cm-<node>, keep the ConfigMap
        current and annotate allocated pods. Each pass runs when something changed (or PASS_PERIOD passed,
        for the kubelet's allocations); a pass at rest asks the API server nothing."""
        from ix_device_plugin.apiserver.errors import KubeError
        from ix_device_plugin.apiserver.settings import KubeConfigError

        if self._api is None:
            return
        errors, backoff = OncePerError(log), self._api.backoff()
        following: asyncio.Task[None] | None = None
        try:
            while True:
                if not self._config.use_volcano:
                    following = await _stopped(following)
                    await self._volcano_wait(CONFIG_POLL, self._wake_events(None))
                    continue
                mode = await self._volcano_mode()
                if following is None or following.done():  # not started, or ended by a failure: (re)start it
                    _said_why_it_ended(following)
                    following = asyncio.create_task(mode.follow(), name="volcano-watches")
                wake, wait = self._wake_events(mode), volcano_pass_period()  # taken before the pass: none missed
                if not self._acting():
                    await self._volcano_wait(CONFIG_POLL, wake)  # the acting pod writes; its stop wakes this one
                    continue
                try:
                    await mode.annotate_allocations(self._current.plan.resource_name)
                    await mode.publish()
                    errors.succeeded("Volcano mode: the API server answers again")
                    backoff.reset()
                except (KubeError, KubeConfigError) as error:
                    errors.failed("Volcano mode: %s; retrying", error)
                    wait = backoff.next_delay()
                await self._volcano_wait(wait, wake)
        finally:
            await _stopped(following)

    def wake_volcano(self) -> None:
        """Run Volcano mode's pass now (this pod has just taken over acting for the node)."""
        self._volcano_soon.set()

    def _wake_events(self, mode: VolcanoMode | None) -> list[asyncio.Event]:
        """Set when the device view or what Volcano mode's watches see changes, or an Allocate asks for a pass."""
        events = [self._current.news, self._volcano_soon]
        return events if mode is None else [*events, mode.pods.news, mode.config_map.news]

    async def _volcano_wait(self, seconds: float, wake: list[asyncio.Event]) -> None:
        """Sleep until seconds pass or one of wake is set (after an Allocate, a little longer)."""
        try:
            async with asyncio.timeout(seconds):
                await first_set(*wake)
        except TimeoutError:
            pass
        if self._volcano_soon.is_set():
            self._volcano_soon.clear()
            await asyncio.sleep(SETTLE)  # the kubelet records the allocation just after Allocate returns


def volcano_pass_period() -> float:
    """Seconds between Volcano mode's passes at rest (its module is loaded only once flags.usevolcano is on)."""
    from ix_device_plugin.deviceplugin.features.volcano import PASS_PERIOD

    return PASS_PERIOD


def _said_why_it_ended(task: asyncio.Task[None] | None) -> None:
    """Log why the watches' task ended, when it did."""
    if task is not None and not task.cancelled() and (error := task.exception()) is not None:
        log.error("Volcano mode: the watches ended: %s: %s; starting them again", type(error).__name__, error)


async def _stopped(task: asyncio.Task[None] | None) -> None:
    """Cancel task (if any) and wait for it to end; None, for the caller to hold."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def chips_of(plan: Plan, device_ids: Iterable[str]) -> list[Chip]:
    """The chips behind these device IDs (IDs the plan does not know were refused before)."""
    return [chip for device_id in device_ids if (device := plan.by_id.get(device_id)) for chip in device.chips]
