"""The DRA driver's gRPC servers on the kubelet's two unix sockets.

The DRAPlugin and resource-health services (v1 and v1beta1 / v1alpha1) on `<plugins dir>/gpu.iluvatar.com/dra.sock`,
the registration service on `<registrar dir>/gpu.iluvatar.com-reg.sock`. Each socket is put in place from a staging
name, so that the name never lacks a socket that answers, and only the sockets this pod put in place are removed
when it stops.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc

from ix_device_plugin.api.dra_health_v1 import api_pb2 as health_v1
from ix_device_plugin.api.dra_health_v1 import api_pb2_grpc as health_v1_grpc
from ix_device_plugin.api.dra_health_v1alpha1 import api_pb2 as health_v1alpha1
from ix_device_plugin.api.dra_health_v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from ix_device_plugin.api.dra_v1 import api_pb2 as dra_v1
from ix_device_plugin.api.dra_v1 import api_pb2_grpc as dra_v1_grpc
from ix_device_plugin.api.dra_v1beta1 import api_pb2 as dra_v1beta1
from ix_device_plugin.api.dra_v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from ix_device_plugin.api.pluginregistration import api_pb2_grpc as registration_grpc
from ix_device_plugin.dra.health import DeviceHealthBoard, HealthService
from ix_device_plugin.dra.registration import (
    RegistrationService,
    put_in_place,
    remove_own_socket,
    remove_stale_sockets,
    staging_socket,
)
from ix_device_plugin.dra.service import DraService, Prepare, Unprepare
from ix_device_plugin.kubelet.sockets import Identity, unix_target
from ix_device_plugin.runtime.service import bounded

log = logging.getLogger(__name__)


class KubeletSockets:
    """The driver's servers on registrar (registration) and endpoint (DRAPlugin and resource health)."""

    def __init__(self, registrar: Path, endpoint: Path) -> None:
        self.registrar, self.endpoint = registrar, endpoint
        self._servers: list[grpc.aio.Server] = []
        self._sockets: dict[Path, Identity] = {}  # the sockets this pod put in place, to remove only those

    async def serve(
        self,
        dirs: tuple[Path, Path],
        claims: tuple[Prepare, Unprepare],
        health_board: DeviceHealthBoard,
        streams_end: asyncio.Event,
        registration_service: RegistrationService,
    ) -> None:
        """Serve both sockets; dirs: the registrar and plugins directories, where killed pods left sockets."""
        endpoint, registrar = self.endpoint, self.registrar
        for path in (registrar, endpoint):
            path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_sockets(*dirs)  # left by a pod that was killed
        dra = grpc.aio.server()
        for pb2, grpc_module in ((dra_v1, dra_v1_grpc), (dra_v1beta1, dra_v1beta1_grpc)):
            service = DraService(*claims, pb2)
            grpc_module.add_DRAPluginServicer_to_server(service, dra)  # type: ignore[attr-defined]
        for pb2, grpc_module in ((health_v1, health_v1_grpc), (health_v1alpha1, health_v1alpha1_grpc)):
            health = HealthService(health_board, pb2, streams_end)
            grpc_module.add_DRAResourceHealthServicer_to_server(health, dra)  # type: ignore[attr-defined]
        await self._serve_on(dra, endpoint)
        registration = grpc.aio.server()
        registration_grpc.add_RegistrationServicer_to_server(registration_service, registration)
        await self._serve_on(registration, registrar)  # last: the plugin watcher asks for the endpoint at once
        log.info("serving %s and %s", registrar, endpoint)

    async def _serve_on(self, server: grpc.aio.Server, path: Path) -> None:
        """Start server on a staging socket, then move it to path: the name never lacks a socket that answers."""
        staging = staging_socket(path)
        server.add_insecure_port(unix_target(staging))
        await server.start()
        self._servers.append(server)
        self._sockets[path] = put_in_place(staging, path)

    async def stop_servers(self, timeout: float) -> None:
        """Stop the servers, each bounded by timeout."""
        for server in self._servers:
            await bounded("stopping a gRPC server", server.stop(timeout), timeout)
        self._servers.clear()

    def remove_sockets(self) -> None:
        """Remove the sockets this pod put in place (and only those: a new pod's may have replaced them)."""
        for path, own in self._sockets.items():
            remove_own_socket(path, own)
        self._sockets.clear()
