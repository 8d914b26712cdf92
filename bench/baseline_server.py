"""The smallest device plugin server grpcio allows: the transport's floor for Allocate and GetPreferredAllocation.

Same library and serving model as the plugin (grpc.aio, unary calls on a unix socket), no work:
Allocate answers one fixed response shaped like the plugin's for one device, and
GetPreferredAllocation returns the first allocation_size available IDs.
Run as `python -m bench.baseline_server SOCKET`.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc

from ix_device_plugin.api import api_pb2, api_pb2_grpc
from ix_device_plugin.kubelet.sockets import unix_target

_UUID = "GPU-00000000-0000-0000-0000-000000000000"
FIXED_ALLOCATE = api_pb2.AllocateResponse(
    container_responses=[
        api_pb2.ContainerAllocateResponse(
            envs={
                "IX_VISIBLE_DEVICES": _UUID,
                "IX_REPLICA_DEVICES": f"{_UUID}::0",
                "ILUVATAR_COREX_VISIBLE_DEVICES": _UUID,
                "ILUVATAR_COREX_REPLICA_DEVICES": f"{_UUID}::0",
            },
            devices=[api_pb2.DeviceSpec(container_path="/dev/iluvatar0", host_path="/dev/iluvatar0", permissions="rw")],
        )
    ]
)


class BaselineService(api_pb2_grpc.DevicePluginServicer):
    """Answers without looking at the node."""

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        """The fixed response."""
        return FIXED_ALLOCATE

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        """The first allocation_size available IDs of each container request."""
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=req.available_deviceIDs[: req.allocation_size])
                for req in request.container_requests
            ]
        )


async def serve(socket_path: str) -> None:
    """Serve on socket_path until SIGTERM or SIGINT."""
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(BaselineService(), server)
    server.add_insecure_port(unix_target(socket_path))
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
