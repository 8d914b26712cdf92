"""A stand-in for the kubelet's pod-resources service, on a real unix socket, for tests and benchmarks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from ix_device_plugin.api.podresources import api_pb2, api_pb2_grpc
from ix_device_plugin.kubelet.sockets import unix_target

# (namespace, pod) -> container -> resource name -> device IDs
Pods = Mapping[tuple[str, str], Mapping[str, Mapping[str, Sequence[str]]]]


class PodResourcesStandIn(api_pb2_grpc.PodResourcesListerServicer):
    """Answers List (and Get) from `pods`, which a test sets as the kubelet would know them."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.pods: Pods = {}
        self.calls = 0
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Serve on socket_path."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(unix_target(self.socket_path))
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving and remove the socket."""
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def _pod(self, namespace: str, name: str) -> api_pb2.PodResources:
        containers = self.pods.get((namespace, name), {})
        return api_pb2.PodResources(
            name=name,
            namespace=namespace,
            containers=[
                api_pb2.ContainerResources(
                    name=container,
                    devices=[
                        api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                        for resource, ids in resources.items()
                    ],
                )
                for container, resources in containers.items()
            ],
        )

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        """Every pod the stand-in knows."""
        self.calls += 1
        return api_pb2.ListPodResourcesResponse(pod_resources=[self._pod(ns, name) for ns, name in self.pods])

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        """One pod."""
        if (request.pod_namespace, request.pod_name) not in self.pods:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        return api_pb2.GetPodResourcesResponse(pod_resources=self._pod(request.pod_namespace, request.pod_name))
