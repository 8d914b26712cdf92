"""A stand-in for the kubelet's DRA manager and plugin watcher, for the tests and the benchmarks.

It behaves as the kubelet does with a DRA driver: dials the registration socket, asks GetInfo, checks the
type, name and versions, answers NotifyRegistrationStatus, then dials the endpoint GetInfo named and calls
NodePrepareResources / NodeUnprepareResources in the newest API version both sides know (or the one asked for).
Like the kubelet it follows the driver's device health (DRAResourceHealth/NodeWatchResources) when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from ix_device_plugin.api.dra_health_v1 import api_pb2 as health_v1
from ix_device_plugin.api.dra_health_v1 import api_pb2_grpc as health_v1_grpc
from ix_device_plugin.api.dra_health_v1alpha1 import api_pb2 as health_v1alpha1
from ix_device_plugin.api.dra_health_v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from ix_device_plugin.api.dra_v1 import api_pb2 as dra_v1
from ix_device_plugin.api.dra_v1 import api_pb2_grpc as dra_v1_grpc
from ix_device_plugin.api.dra_v1beta1 import api_pb2 as dra_v1beta1
from ix_device_plugin.api.dra_v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from ix_device_plugin.api.pluginregistration import api_pb2 as registration_pb2
from ix_device_plugin.api.pluginregistration import api_pb2_grpc as registration_grpc
from ix_device_plugin.kubelet.sockets import CHANNEL_OPTIONS, unix_target

CALL_TIMEOUT = 10.0
# The services this kubelet knows, newest first, as PluginInfo.supported_versions names them.
KNOWN_VERSIONS = {"v1.DRAPlugin": (dra_v1, dra_v1_grpc), "v1beta1.DRAPlugin": (dra_v1beta1, dra_v1beta1_grpc)}
Claim = tuple[str, str, str]  # (namespace, name, uid)
HEALTH_VERSIONS = {"v1": (health_v1, health_v1_grpc), "v1alpha1": (health_v1alpha1, health_v1alpha1_grpc)}


class RegistrationRefused(Exception):
    """The stand-in refused the plugin; the message says why (and the plugin was told)."""


class DraKubeletStandIn:
    """The kubelet side of DRA over real unix sockets."""

    def __init__(self, driver: str, known_versions: Sequence[str] = tuple(KNOWN_VERSIONS)) -> None:
        self.driver = driver
        self.known_versions = tuple(known_versions)
        self.info: registration_pb2.PluginInfo | None = None
        self.version: str = ""
        self._channel: grpc.aio.Channel | None = None

    async def register(self, registration_socket: Path) -> registration_pb2.PluginInfo:
        """GetInfo, check it, NotifyRegistrationStatus; then dial the endpoint. Raises RegistrationRefused."""
        async with grpc.aio.insecure_channel(unix_target(registration_socket), options=CHANNEL_OPTIONS) as channel:
            stub = registration_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(registration_pb2.InfoRequest(), timeout=CALL_TIMEOUT)
            problem = self._problem(info)
            status = registration_pb2.RegistrationStatus(plugin_registered=problem is None, error=problem or "")
            await stub.NotifyRegistrationStatus(status, timeout=CALL_TIMEOUT)
        if problem is not None:
            raise RegistrationRefused(problem)
        self.info = info
        self.version = next(v for v in self.known_versions if v in info.supported_versions)
        await self.close()
        self._channel = grpc.aio.insecure_channel(unix_target(info.endpoint), options=CHANNEL_OPTIONS)
        return info

    def _problem(self, info: registration_pb2.PluginInfo) -> str | None:
        if info.type != "DRAPlugin":
            return f"plugin type {info.type!r} is not DRAPlugin"
        if info.name != self.driver:
            return f"driver name {info.name!r} is not {self.driver!r}"
        if not any(v in info.supported_versions for v in self.known_versions):
            return f"none of the versions {list(info.supported_versions)} is one of {list(self.known_versions)}"
        if not Path(info.endpoint).is_absolute():
            return f"endpoint {info.endpoint!r} is not an absolute path"
        return None

    async def close(self) -> None:
        """Close the connection to the plugin."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def watch_health(self, version: str = "v1") -> HealthWatch:
        """Open NodeWatchResources in version (v1 or v1alpha1) and collect its messages until closed."""
        assert self._channel is not None, "register first"
        pb2, grpc_module = HEALTH_VERSIONS[version]
        watch = HealthWatch(pb2, grpc_module.DRAResourceHealthStub(self._channel))
        await watch.start()
        return watch

    def _api(self, version: str | None) -> tuple[Any, Any]:
        assert self._channel is not None, "register first"
        pb2, grpc_module = KNOWN_VERSIONS[version or self.version]
        return pb2, grpc_module.DRAPluginStub(self._channel)

    async def prepare(self, claims: Sequence[Claim], version: str | None = None) -> Any:
        """NodePrepareResources for claims (namespace, name, uid); the response message."""
        pb2, stub = self._api(version)
        request = pb2.NodePrepareResourcesRequest(claims=[pb2.Claim(namespace=n, name=m, uid=u) for n, m, u in claims])
        return await stub.NodePrepareResources(request, timeout=CALL_TIMEOUT)

    async def unprepare(self, claims: Sequence[Claim], version: str | None = None) -> Any:
        """NodeUnprepareResources for claims; the response message."""
        pb2, stub = self._api(version)
        request = pb2.NodeUnprepareResourcesRequest(
            claims=[pb2.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
        )
        return await stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT)

    async def wait_for_socket(self, path: Path, timeout: float = 5.0) -> None:
        """Wait until the plugin's registration socket appears, as the plugin watcher does."""
        async with asyncio.timeout(timeout):
            while not path.is_socket():
                await asyncio.sleep(0.02)


class HealthWatch:
    """One NodeWatchResources stream: every message, and each device's latest (health name, message)."""

    def __init__(self, pb2: Any, stub: Any) -> None:
        self.pb2 = pb2
        self.messages: list[tuple[float, Any]] = []  # (monotonic arrival, message)
        self.devices: dict[str, tuple[str, str]] = {}
        self._call = stub.NodeWatchResources(pb2.NodeWatchResourcesRequest())
        self._task: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()

    async def start(self) -> None:
        """Start reading the stream."""
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        async for message in self._call:
            self.messages.append((loop.time(), message))
            for device in message.devices:
                health = self.pb2.HealthStatus.Name(device.health)
                self.devices[device.device.device_name] = (health, device.message)
            self._arrived.set()

    async def wait_for(self, predicate: Any, timeout: float = 5.0) -> None:
        """Wait until predicate(self) holds."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                self._arrived.clear()
                await self._arrived.wait()

    async def close(self) -> None:
        """End the stream."""
        self._call.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self._task
