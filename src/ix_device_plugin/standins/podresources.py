"""A stand-in for the kubelet's pod-resources service, on a real unix socket, for tests and benchmarks.

It answers as the kubelet (1.37) does: each container's device-plugin devices, and the devices of the
ResourceClaims it lists in `resources.claims` as `dynamic_resources` (the claim's name and namespace, which is
the pod's, and per device the driver, pool, device, share ID and CDI devices). As in the kubelet's
GetDynamicResources, a claim's devices are taken driver by driver, and each device's `cdi_devices` holds the CDI
devices of the driver's devices before it too, so a reader must identify a device by driver, pool and name.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from ix_device_plugin.api.podresources import api_pb2, api_pb2_grpc
from ix_device_plugin.kubelet.sockets import unix_target


@dataclass(frozen=True)
class ClaimResource:
    """One device of a prepared claim as the kubelet keeps it: its driver, pool and name, the CDI devices the
    driver answered, and its share of a shared device (None: held whole)."""

    driver: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True)
class PodClaim:
    """A ResourceClaim a container lists in `resources.claims` (claims live in their pod's namespace)."""

    name: str
    resources: tuple[ClaimResource, ...]


# (namespace, pod) -> container -> resource name -> device IDs
Pods = Mapping[tuple[str, str], Mapping[str, Mapping[str, Sequence[str]]]]
# (namespace, pod) -> container -> the claims it uses
Claims = Mapping[tuple[str, str], Mapping[str, Sequence[PodClaim]]]


class PodResourcesStandIn(api_pb2_grpc.PodResourcesListerServicer):
    """Answers List (and Get) from `pods` and `claims`, which a test sets as the kubelet would know them."""

    def __init__(self, socket_path: Path, started_ago: float = 3600.0) -> None:
        self.socket_path = socket_path
        # As a kubelet that has run this long (its socket is made at its start): one just started may not know
        # every pod yet, and the agent does not trust its answer that a chip is free until it has run a while.
        self.started_ago = started_ago
        self.pods: Pods = {}
        self.claims: Claims = {}
        self.calls = 0
        self.before_list: Callable[[], Awaitable[None]] | None = None  # a test's step before List answers
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Serve on socket_path."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(unix_target(self.socket_path))
        await server.start()
        self._server = server
        started = time.time() - self.started_ago
        os.utime(self.socket_path, (started, started))

    async def stop(self) -> None:
        """Stop serving and remove the socket."""
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def _known(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys([*self.pods, *self.claims]))

    def _pod(self, namespace: str, name: str) -> api_pb2.PodResources:
        devices = self.pods.get((namespace, name), {})
        claims = self.claims.get((namespace, name), {})
        return api_pb2.PodResources(
            name=name,
            namespace=namespace,
            containers=[
                api_pb2.ContainerResources(
                    name=container,
                    devices=[
                        api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                        for resource, ids in devices.get(container, {}).items()
                    ],
                    dynamic_resources=[_dynamic_resource(namespace, claim) for claim in claims.get(container, ())],
                )
                for container in dict.fromkeys([*devices, *claims])
            ],
        )

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        """Every pod the stand-in knows."""
        self.calls += 1
        if self.before_list is not None:
            await self.before_list()
        return api_pb2.ListPodResourcesResponse(pod_resources=[self._pod(ns, name) for ns, name in self._known()])

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        """One pod."""
        if (request.pod_namespace, request.pod_name) not in self._known():
            await context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        return api_pb2.GetPodResourcesResponse(pod_resources=self._pod(request.pod_namespace, request.pod_name))


def _dynamic_resource(namespace: str, claim: PodClaim) -> api_pb2.DynamicResource:
    """The claim as the kubelet reports it: devices grouped by driver, CDI devices accumulated within a driver."""
    by_driver: dict[str, list[ClaimResource]] = {}
    for resource in claim.resources:
        by_driver.setdefault(resource.driver, []).append(resource)
    reported = []
    for driver, resources in by_driver.items():
        cdi_devices: list[api_pb2.CDIDevice] = []
        for resource in resources:
            cdi_devices += [api_pb2.CDIDevice(name=cdi_id) for cdi_id in resource.cdi_ids]
            reported.append(
                api_pb2.ClaimResource(
                    cdi_devices=list(cdi_devices),
                    driver_name=driver,
                    pool_name=resource.pool,
                    device_name=resource.device,
                    share_id=resource.share_id,
                )
            )
    return api_pb2.DynamicResource(claim_name=claim.name, claim_namespace=namespace, claim_resources=reported)
