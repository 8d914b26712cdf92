"""A stand-in for the kubelet's device manager, for the demo, the tests and the benchmarks.

It behaves as the kubelet does: serves Registration on kubelet.sock, dials the
plugin back inside Register, asks for its options, then follows ListAndWatch,
replacing its whole view of the resource with every message. A restart wipes
every socket in the directory and serves a fresh kubelet.sock, forgetting all
plugins, and nothing reconnects on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ix_device_plugin.api import API_VERSION, HEALTHY, UNHEALTHY, api_pb2, api_pb2_grpc
from ix_device_plugin.kubelet.registration import KUBELET_SOCKET
from ix_device_plugin.kubelet.sockets import CHANNEL_OPTIONS, unix_target

log = logging.getLogger(__name__)
DIAL_TIMEOUT = 10.0


@dataclass
class ResourceView:
    """What the stand-in knows about one registered resource."""

    endpoint: str
    options: api_pb2.DevicePluginOptions
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    numa: dict[str, tuple[int, ...]] = field(default_factory=dict)
    updates: int = 0
    connected: bool = True

    @property
    def capacity(self) -> int:
        """Devices advertised (node capacity)."""
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        """Healthy devices (node allocatable)."""
        return sum(1 for health in self.devices.values() if health == HEALTHY)


class KubeletStandIn(api_pb2_grpc.RegistrationServicer):
    """The kubelet side of the device plugin API, on a real unix socket."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.resources: dict[str, ResourceView] = {}
        self.registrations: list[api_pb2.RegisterRequest] = []
        self._server: grpc.aio.Server | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Condition()

    async def start(self) -> None:
        """Serve Registration on <plugin_dir>/kubelet.sock."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(unix_target(self.plugin_dir / KUBELET_SOCKET))
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving and drop every plugin connection."""
        for task in self._streams.values():
            task.cancel()
        await asyncio.gather(*self._streams.values(), return_exceptions=True)
        self._streams.clear()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        (self.plugin_dir / KUBELET_SOCKET).unlink(missing_ok=True)

    async def restart(self) -> None:
        """Restart as the kubelet does: forget plugins, wipe every socket, serve a new kubelet.sock."""
        await self.stop()
        for entry in self.plugin_dir.iterdir():
            if entry.is_socket():
                entry.unlink(missing_ok=True)
        async with self._changed:
            self.resources.clear()
            self._changed.notify_all()
        await self.start()

    # ---- Registration service -------------------------------------------------------------

    async def Register(self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext) -> api_pb2.Empty:
        """Validate, dial the plugin back, read its options and follow its ListAndWatch."""
        self.registrations.append(request)
        if request.version != API_VERSION:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        if "/" not in request.resource_name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid resource {request.resource_name!r}")
        target = unix_target(self.plugin_dir / request.endpoint)
        channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        try:
            await asyncio.wait_for(channel.channel_ready(), DIAL_TIMEOUT)
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=DIAL_TIMEOUT)
        except (TimeoutError, grpc.aio.AioRpcError) as error:
            await channel.close()
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot dial plugin at {target}: {error}")
        await self._replace(request.resource_name, channel, ResourceView(request.endpoint, options), stub)
        return api_pb2.Empty()

    async def _replace(
        self,
        resource: str,
        channel: grpc.aio.Channel,
        view: ResourceView,
        stub: api_pb2_grpc.DevicePluginStub,
    ) -> None:
        old_task = self._streams.pop(resource, None)
        old_channel = self._channels.pop(resource, None)
        if old_task is not None:
            old_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await old_task
        if old_channel is not None:
            await old_channel.close()
        async with self._changed:
            self.resources[resource] = view
            self._changed.notify_all()
        self._channels[resource] = channel
        self._streams[resource] = asyncio.create_task(self._follow(resource, view, stub))

    async def _follow(self, resource: str, view: ResourceView, stub: api_pb2_grpc.DevicePluginStub) -> None:
        try:
            async for response in stub.ListAndWatch(api_pb2.Empty()):
                async with self._changed:
                    view.devices = {d.ID: d.health for d in response.devices}
                    view.numa = {d.ID: tuple(n.ID for n in d.topology.nodes) for d in response.devices}
                    view.updates += 1
                    self._changed.notify_all()
        except grpc.aio.AioRpcError:
            pass
        async with self._changed:
            # As the kubelet does when a plugin goes away: its devices stay but are unusable.
            view.connected = False
            view.devices = dict.fromkeys(view.devices, UNHEALTHY)
            self._changed.notify_all()

    # ---- what a test or the demo asks -----------------------------------------------------

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until predicate() holds; raises TimeoutError."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_registered(self, resource: str, timeout: float = 5.0, capacity: int | None = None) -> ResourceView:
        """Wait for resource to be registered, connected and listed (with capacity devices when given)."""

        def ready() -> bool:
            view = self.resources.get(resource)
            return (
                view is not None
                and view.connected
                and view.updates > 0
                and (capacity is None or view.capacity == capacity)
            )

        await self.wait_for(ready, timeout)
        return self.resources[resource]

    def capacity(self, resource: str) -> int:
        """Capacity of resource as the node would report it (0 when unknown)."""
        view = self.resources.get(resource)
        return 0 if view is None else view.capacity

    def _stub(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        return api_pb2_grpc.DevicePluginStub(self._channels[resource])

    async def allocate(self, resource: str, requests: Sequence[Sequence[str]]) -> api_pb2.AllocateResponse:
        """Call Allocate with one container request per item of requests."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids)) for ids in requests]
        )
        return await self._stub(resource).Allocate(request, timeout=10)

    async def preferred(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """Call GetPreferredAllocation for one container; the IDs it prefers."""
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        response = await self._stub(resource).GetPreferredAllocation(request, timeout=10)
        return list(response.container_responses[0].deviceIDs)

    async def admit(self, resource: str, count: int) -> api_pb2.ContainerAllocateResponse:
        """Admit a container asking for count devices, as the kubelet does: prefer, then allocate."""
        view = self.resources[resource]
        available = [device_id for device_id, health in view.devices.items() if health == HEALTHY]
        chosen = await self.preferred(resource, available, [], count)
        response = await self.allocate(resource, [chosen])
        return response.container_responses[0]
