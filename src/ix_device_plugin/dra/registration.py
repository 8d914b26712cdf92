"""How the kubelet finds the DRA driver: its sockets, and the plugin watcher's Registration service."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc

from ix_device_plugin.api.pluginregistration import api_pb2 as registration_pb2
from ix_device_plugin.api.pluginregistration import api_pb2_grpc as registration_grpc
from ix_device_plugin.dra.slices import DRIVER

log = logging.getLogger(__name__)

REGISTRATION_SOCKET = f"{DRIVER}-reg.sock"
DRA_SOCKET = "dra.sock"
PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def plugin_dir(plugins_dir: Path) -> Path:
    """The driver's directory under the kubelet's plugins directory (socket and checkpoint)."""
    return plugins_dir / DRIVER


def registration_socket(registrar_dir: Path) -> Path:
    """Where the plugin watcher finds the driver."""
    return registrar_dir / REGISTRATION_SOCKET


def dra_socket(plugins_dir: Path) -> Path:
    """The DRAPlugin service's socket, the endpoint GetInfo names."""
    return plugin_dir(plugins_dir) / DRA_SOCKET


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
