"""A stand-in for the kubelet's device manager, for the demo, the tests and the benchmarks.

It behaves as the kubelet does: serves Registration on kubelet.sock, dials the
plugin back inside Register, asks for its options, then follows ListAndWatch,
replacing its whole view of the resource with every message. A restart wipes
every socket in the directory and serves a fresh kubelet.sock, forgetting all
plugins, and nothing reconnects on its own.

Several endpoints for one resource (two pods of a plugin during an update), as the kubelet's device manager has
it (pkg/kubelet/cm/devicemanager): from 1.37 (several_endpoints) it keeps one per socket, every one's messages
replace the view, the newest registration answers Allocate, and only the last one's disconnect makes the devices
unusable. Before (several_endpoints=False) a registration replaced "the" endpoint of the resource, and when the
replaced one's stream ended the kubelet disconnected the endpoint current then: the newer one.
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

    endpoint: str  # the one answering Allocate: the newest registration
    options: api_pb2.DevicePluginOptions
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    numa: dict[str, tuple[int, ...]] = field(default_factory=dict)
    updates: int = 0
    connected: bool = True
    allocatable_seen: list[int] = field(default_factory=list)  # allocatable after each change, in order

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

    def __init__(self, plugin_dir: Path, several_endpoints: bool = True, refuses_connected: bool = False) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.several_endpoints = several_endpoints
        # Kubelet 1.37: a registration of a socket it still follows is refused (before 1.37 it replaced the old one).
        self.refuses_connected = refuses_connected
        self.resources: dict[str, ResourceView] = {}
        self.registrations: list[api_pb2.RegisterRequest] = []
        self._server: grpc.aio.Server | None = None
        self._endpoints: dict[str, dict[str, _Endpoint]] = {}  # resource -> socket name -> its connection
        self._replaced: set[asyncio.Task[None]] = set()  # before 1.37: streams of replaced endpoints, still followed
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
        for endpoints in self._endpoints.values():
            for endpoint in endpoints.values():
                await endpoint.close()
        self._endpoints.clear()
        for task in self._replaced:
            task.cancel()
        await asyncio.gather(*self._replaced, return_exceptions=True)
        self._replaced.clear()
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
        followed = self._endpoints.get(request.resource_name, {}).get(request.endpoint)
        if self.refuses_connected and followed is not None and (followed.orphaned or not followed.task.done()):
            # As kubelet 1.37 does: it forgets its client of the socket but keeps the endpoint, which its stream's
            # end then never removes; every later registration of the socket is refused, until a kubelet restart.
            followed.orphaned = True
            path = self.plugin_dir / request.endpoint
            await context.abort(grpc.StatusCode.UNKNOWN, f"device plugin already connected: {path}")
        channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        try:
            async with asyncio.timeout(DIAL_TIMEOUT):
                await channel.channel_ready()
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=DIAL_TIMEOUT)
        except (TimeoutError, grpc.aio.AioRpcError) as error:
            await channel.close()
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot dial plugin at {target}: {error}")
        await self._connect(request.resource_name, request.endpoint, channel, stub, options)
        return api_pb2.Empty()

    async def _connect(
        self,
        resource: str,
        name: str,
        channel: grpc.aio.Channel,
        stub: api_pb2_grpc.DevicePluginStub,
        options: api_pb2.DevicePluginOptions,
    ) -> None:
        endpoints = self._endpoints.setdefault(resource, {})
        same = endpoints.pop(name, None)
        if same is not None:  # the plugin registered again on the same socket: the old connection is gone
            await same.close()
        if not self.several_endpoints:
            for replaced in endpoints.values():  # still followed: its end disconnects whatever is current then
                self._replaced.add(replaced.task)
                replaced.task.add_done_callback(self._replaced.discard)
            endpoints.clear()
        async with self._changed:
            view = self.resources.get(resource)
            if view is None or not view.connected:
                view = self.resources[resource] = ResourceView(name, options)
            view.endpoint, view.options = name, options
            self._changed.notify_all()
        endpoints[name] = _Endpoint(channel, asyncio.create_task(self._follow(resource, name, stub)))

    async def _follow(self, resource: str, name: str, stub: api_pb2_grpc.DevicePluginStub) -> None:
        try:
            async for response in stub.ListAndWatch(api_pb2.Empty()):
                async with self._changed:
                    view = self.resources[resource]
                    view.devices = {d.ID: d.health for d in response.devices}
                    view.numa = {d.ID: tuple(n.ID for n in d.topology.nodes) for d in response.devices}
                    view.updates += 1
                    view.allocatable_seen.append(view.allocatable)
                    self._changed.notify_all()
        except grpc.aio.AioRpcError:
            pass
        endpoints = self._endpoints.get(resource, {})
        if endpoints.get(name) is not None and endpoints[name].orphaned:
            return  # kept for good, its devices as last listed: no client is left to disconnect it
        if endpoints.get(name) is not None and endpoints[name].task is asyncio.current_task():
            del endpoints[name]
        elif self.several_endpoints or asyncio.current_task() not in self._replaced:
            return  # replaced by a registration on the same socket
        else:  # before 1.37: a replaced endpoint's end disconnects the current one
            for current in endpoints.values():
                current.task.cancel()
            endpoints.clear()
        async with self._changed:
            view = self.resources.get(resource)
            if view is None:
                return
            if endpoints:  # another endpoint serves on
                view.endpoint = next(reversed(endpoints))
            else:  # as the kubelet does when the last plugin goes away: its devices stay but are unusable
                view.connected = False
                view.devices = dict.fromkeys(view.devices, UNHEALTHY)
                view.allocatable_seen.append(0)
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
        endpoint = self._endpoints[resource][self.resources[resource].endpoint]
        return api_pb2_grpc.DevicePluginStub(endpoint.channel)

    def endpoints(self, resource: str) -> list[str]:
        """The socket names connected for resource, oldest first."""
        return list(self._endpoints.get(resource, {}))

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


@dataclass
class _Endpoint:
    """One plugin socket the stand-in follows."""

    channel: grpc.aio.Channel
    task: asyncio.Task[None]
    orphaned: bool = False  # a second registration of its socket was refused: the kubelet lost its client of it

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        await self.channel.close()
