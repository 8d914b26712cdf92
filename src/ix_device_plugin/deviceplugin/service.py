"""The DevicePlugin gRPC service: translates between v1beta1 messages and the core."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from ix_device_plugin.api import HEALTHY, UNHEALTHY, api_pb2, api_pb2_grpc
from ix_device_plugin.core.allocation import DEVICE_PERMISSIONS, AllocationError, allocate
from ix_device_plugin.core.plan import Plan
from ix_device_plugin.core.preferred import preferred
from ix_device_plugin.deviceplugin.state import Current, first_set
from ix_device_plugin.runtime.memory import release_free_memory

log = logging.getLogger(__name__)

# Called after each RPC with (method, seconds, error or None); metrics hook in here.
CallObserver = Callable[[str, float, str | None], None]
Response = TypeVar("Response")
# Work to do before Allocate answers (Volcano's choice of devices, a GPU reset), given the plan and the
# request that were checked: the request to answer from the state as it is then, or None to answer the
# one checked. AllocationError refuses the call.
BeforeAllocate = Callable[[Plan, api_pb2.AllocateRequest], Awaitable[api_pb2.AllocateRequest | None]]


def list_response(plan: Plan) -> api_pb2.ListAndWatchResponse:
    """The full device list of plan as one ListAndWatch message."""
    devices = []
    for device in plan.devices:
        message = api_pb2.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)
        if device.numa_nodes:
            message.topology.nodes.extend(api_pb2.NUMANode(ID=node) for node in device.numa_nodes)
        devices.append(message)
    return api_pb2.ListAndWatchResponse(devices=devices)


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """Answers from the Current state at the moment of each call; streams follow its device view."""

    def __init__(
        self, current: Current, observer: CallObserver | None = None, before_allocate: BeforeAllocate | None = None
    ) -> None:
        self._current = current
        self._closed = asyncio.Event()
        self._observer = observer
        self._before_allocate = before_allocate
        self._message: tuple[int, api_pb2.ListAndWatchResponse] | None = None  # (view generation, message)
        self.streams = 0
        self.newest_stream = float("-inf")  # time.monotonic() when the newest ListAndWatch stream opened

    @property
    def plan(self) -> Plan:
        """The plan being served now."""
        return self._current.plan

    def close(self) -> None:
        """End every ListAndWatch stream."""
        self._closed.set()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        """Options: no PreStartContainer, GetPreferredAllocation available."""
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        """The full device list now, then again on every change of the device view, until the plugin stops."""
        self.streams += 1
        self.newest_stream = time.monotonic()
        try:
            seen = -1
            while not self._closed.is_set():
                current = self._current
                if current.view_generation != seen:
                    seen, message = self._list_message()
                    yield message
                    release_free_memory()  # building and sending a list of thousands leaves ~1 MiB freed
                    continue
                await first_set(current.news, self._closed)
        finally:
            self.streams -= 1

    def _list_message(self) -> tuple[int, api_pb2.ListAndWatchResponse]:
        """The message for the current device view, built once per view and shared by every stream."""
        generation = self._current.view_generation
        if self._message is None or self._message[0] != generation:
            self._message = (generation, list_response(self._current.plan))
        return self._message

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        """A preferred set per container request (see preferred.py for the policy)."""
        plan = self._current.plan
        return await self._answer("GetPreferredAllocation", context, lambda: _preferred_response(plan, request))

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        """Device nodes and environment for each container; all or nothing."""
        return await self._answer_async("Allocate", context, lambda: self._allocate(request))

    async def _allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        plan = self._current.plan
        response = _allocate_response(plan, request)  # a bad request is refused before anything is done
        if self._before_allocate is not None:
            answered = await self._before_allocate(plan, request)
            if answered is not None:
                response = _allocate_response(self._current.plan, answered)
        return response

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        """Nothing to do before a container starts."""
        return api_pb2.PreStartContainerResponse()

    async def _answer(self, method: str, context: grpc.aio.ServicerContext, build: Callable[[], Response]) -> Response:
        """build()'s response, timed; an AllocationError becomes a gRPC status with its message."""

        async def built() -> Response:
            return build()

        return await self._answer_async(method, context, built)

    async def _answer_async(
        self, method: str, context: grpc.aio.ServicerContext, build: Callable[[], Awaitable[Response]]
    ) -> Response:
        """The response build() gives, timed; an AllocationError becomes a gRPC status with its message."""
        started = time.perf_counter()
        try:
            response = await build()
        except AllocationError as error:
            code = grpc.StatusCode.FAILED_PRECONDITION if error.unavailable else grpc.StatusCode.INVALID_ARGUMENT
            self._observe(method, started, code.name)
            log.warning("%s refused: %s", method, error)
            await context.abort(code, str(error))
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as error:  # a defect: answer the kubelet, keep serving; the trace only at debug
            self._observe(method, started, grpc.StatusCode.INTERNAL.name)
            log.error("%s failed: %s: %s", method, type(error).__name__, error)
            log.debug("%s failed", method, exc_info=True)
            await context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {error}")
        self._observe(method, started, None)
        return response

    def _observe(self, method: str, started: float, error: str | None) -> None:
        if self._observer is not None:
            self._observer(method, time.perf_counter() - started, error)


def _preferred_response(plan: Plan, request: api_pb2.PreferredAllocationRequest) -> api_pb2.PreferredAllocationResponse:
    return api_pb2.PreferredAllocationResponse(
        container_responses=[
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=preferred(plan, req.available_deviceIDs, req.must_include_deviceIDs, req.allocation_size)
            )
            for req in request.container_requests
        ]
    )


def _allocate_response(plan: Plan, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
    if not request.container_requests:
        raise AllocationError("allocate request has no container requests")
    return api_pb2.AllocateResponse(
        container_responses=[
            _container_response(plan, list(req.devices_ids), index)
            for index, req in enumerate(request.container_requests)
        ]
    )


def _container_response(plan: Plan, device_ids: list[str], index: int) -> api_pb2.ContainerAllocateResponse:
    allocation = allocate(plan, device_ids, index)
    return api_pb2.ContainerAllocateResponse(
        envs=allocation.envs,
        annotations=allocation.annotations,
        cdi_devices=[api_pb2.CDIDevice(name=name) for name in allocation.cdi_devices],
        devices=[
            api_pb2.DeviceSpec(container_path=inside, host_path=host, permissions=DEVICE_PERMISSIONS)
            for host, inside in allocation.device_specs
        ],
    )
