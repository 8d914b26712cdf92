"""Registering the plugin with the kubelet over kubelet.sock."""

from __future__ import annotations

from pathlib import Path

import grpc

from ix_device_plugin.api import API_VERSION, api_pb2, api_pb2_grpc
from ix_device_plugin.kubelet.sockets import CHANNEL_OPTIONS, unix_target

KUBELET_SOCKET = "kubelet.sock"


class RegistrationError(Exception):
    """The kubelet could not be reached or refused the registration."""


async def register(plugin_dir: str | Path, endpoint: str, resource_name: str, timeout: float = 5.0) -> None:
    """Register endpoint (a socket name in plugin_dir) for resource_name; raises RegistrationError."""
    kubelet = Path(plugin_dir) / KUBELET_SOCKET
    request = api_pb2.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    async with grpc.aio.insecure_channel(unix_target(kubelet), options=CHANNEL_OPTIONS) as channel:
        try:
            await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as error:
            raise RegistrationError(f"register with {kubelet}: {error.code().name}: {error.details()}") from error
