"""Which container holds which device, from the kubelet's pod-resources API v1 (List).

Read as dcgm-exporter and ix-exporter read it; the devices of DRA claims from each container's `dynamic_resources`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Set
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc

from ix_device_plugin.core.holding import chip_holder, describe, unknown_holder
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.telemetry import ClaimDevice, Holdings, PodRef
from ix_device_plugin.kubelet.sockets import CHANNEL_OPTIONS, unix_target
from ix_device_plugin.runtime.logs import OncePerError

if TYPE_CHECKING:
    from ix_device_plugin.api.podresources import api_pb2

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# The kubelet answers for every pod of the node in one message: a few hundred pods are well under 1 MiB. A larger
# answer is refused (decoded, 4 MiB of device IDs take about 15 MiB; 16 MiB would take over 50).
MAX_MESSAGE = 4 * 1024 * 1024
# Seconds after the kubelet's start (its socket made anew) before its answer decides that no container holds a chip.
KUBELET_SETTLE = 15.0
_Answer = TypeVar("_Answer")


class PodResourcesError(Exception):
    """The pod-resources socket could not be read; the message says which and why."""


async def list_allocations(socket_path: Path, resource_names: Set[str], timeout: float) -> dict[str, PodRef]:
    """Device ID -> the container it is allocated to, for devices of resource_names; PodResourcesError."""
    client = PodResourcesClient(socket_path)
    try:
        return await client.allocations(resource_names, timeout)
    finally:
        await client.close()


class PodResourcesClient:
    """One channel to the pod-resources socket, kept between calls (telemetry asks every pass)."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._channel: grpc.aio.Channel | None = None

    async def allocations(self, resource_names: Set[str], timeout: float) -> dict[str, PodRef]:
        """Device ID -> the container it is allocated to, for devices of resource_names; PodResourcesError."""
        return _allocations(await self._list(timeout), resource_names)

    async def holdings(self, timeout: float) -> Holdings:
        """Every device and claim device the node's containers hold; PodResourcesError."""
        return _holdings(await self._list(timeout))

    async def _list(self, timeout: float) -> api_pb2.ListPodResourcesResponse:
        from ix_device_plugin.api.podresources import api_pb2, api_pb2_grpc  # loaded once the socket is asked

        if self._channel is None:
            options = (*CHANNEL_OPTIONS, ("grpc.max_receive_message_length", MAX_MESSAGE))
            self._channel = grpc.aio.insecure_channel(unix_target(self.socket_path), options=options)
        try:
            response = await api_pb2_grpc.PodResourcesListerStub(self._channel).List(
                api_pb2.ListPodResourcesRequest(), timeout=timeout
            )
        except grpc.aio.AioRpcError as error:
            await self.close()  # a kubelet that restarted gets a fresh channel next time
            why = f"{error.code().name}: {error.details()}"
            if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                why = f"the answer is over the {MAX_MESSAGE // (1024 * 1024)} MiB allowed ({why})"
            raise PodResourcesError(f"pod resources {self.socket_path}: {why}") from None
        return response

    async def close(self) -> None:
        """Close the channel; the next call opens another."""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


def _allocations(response: api_pb2.ListPodResourcesResponse, resource_names: Set[str]) -> dict[str, PodRef]:
    allocations: dict[str, PodRef] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name in resource_names:
                    for device_id in devices.device_ids:
                        allocations[device_id] = PodRef(pod.namespace, pod.name, container.name)
    return allocations


def _holdings(response: api_pb2.ListPodResourcesResponse) -> Holdings:
    devices: list[tuple[str, str, PodRef]] = []
    claims: list[ClaimDevice] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for held in container.devices:
                devices.extend((held.resource_name, device_id, ref) for device_id in held.device_ids)
            for claim in container.dynamic_resources:
                claims.extend(
                    ClaimDevice(
                        ref,
                        claim.claim_namespace,
                        claim.claim_name,
                        resource.driver_name,
                        resource.pool_name,
                        resource.device_name,
                        resource.share_id,
                    )
                    for resource in claim.claim_resources
                )
    return Holdings(tuple(devices), tuple(claims))


class PodResources:
    """The node's one pod-resources reader, shared by telemetry and Volcano mode; absent socket means unknown."""

    def __init__(self, socket_path: Path | None) -> None:
        self.socket_path = socket_path
        self._client: PodResourcesClient | None = None

    async def read(self, resource_names: Set[str]) -> dict[str, PodRef]:
        """Device ID -> the container holding it; PodResourcesError when that cannot be known (no socket too)."""
        return await self._reader().allocations(resource_names, timeout=2.0)

    async def chip_holder(
        self, uuid: str, inventory: Inventory, driver: str, *, split_only: bool = False, claims: bool = True
    ) -> str | None:
        """The container holding the chip under any resource name (core/holding.py), and through driver's claims
        unless claims is False; why that cannot be known; or None when no container does."""
        try:
            holdings = await self._settled_reader().holdings(timeout=2.0)
        except PodResourcesError as error:
            return unknown_holder("a container", error)
        if not claims:
            holdings = Holdings(devices=holdings.devices)
        ref = chip_holder(uuid, holdings, inventory, driver, split_only)
        return None if ref is None else describe(ref)

    async def read_holdings(self) -> Holdings:
        """Every device and claim device the node's containers hold; PodResourcesError when that cannot be known."""
        return await self._settled_reader().holdings(timeout=2.0)

    async def allocations(self, resource_names: Set[str], errors: OncePerError) -> dict[str, PodRef]:
        """Device ID -> the container holding it (empty when unknown); a failure is said once through errors."""
        return await self._said_once(lambda client: client.allocations(resource_names, timeout=2.0), {}, errors)

    async def holdings(self, errors: OncePerError) -> Holdings:
        """Every device and claim device the node's containers hold (none when unknown); a failure is said once."""
        return await self._said_once(lambda client: client.holdings(timeout=2.0), Holdings(), errors)

    def _settled_reader(self) -> PodResourcesClient:
        """The client, for an answer that decides whether a chip is free (a reset): PodResourcesError also while the
        kubelet started less than KUBELET_SETTLE seconds ago (the socket is made anew at its every start). A kubelet
        that just started answers pod-resources before it has the node's pods from the API server, and its first
        answers can miss a container that holds a device."""
        reader = self._reader()
        try:
            age = time.time() - os.stat(reader.socket_path).st_mtime
        except OSError as error:
            raise PodResourcesError(f"pod resources {reader.socket_path}: {error.strerror or error}") from None
        if age < KUBELET_SETTLE:
            raise PodResourcesError(
                f"pod resources {reader.socket_path}: the kubelet started {max(age, 0.0):.0f}s ago and may not know "
                f"every pod yet (it is asked again once it has run {KUBELET_SETTLE:g}s)"
            )
        return reader

    def _reader(self) -> PodResourcesClient:
        """The client, opened at first use; PodResourcesError when the socket is turned off or not there."""
        if self.socket_path is None:
            raise PodResourcesError("the pod-resources socket is turned off (--pod-resources-socket)")
        if not self.socket_path.exists():
            raise PodResourcesError(f"pod resources {self.socket_path}: no such socket")
        if self._client is None:
            self._client = PodResourcesClient(self.socket_path)
        return self._client

    async def _said_once(
        self, ask: Callable[[PodResourcesClient], Awaitable[_Answer]], unknown: _Answer, errors: OncePerError
    ) -> _Answer:
        """ask's answer; unknown without a socket, or when it fails (said once through errors)."""
        if self.socket_path is None or not self.socket_path.exists():
            return unknown
        try:
            answer = await ask(self._reader())
        except PodResourcesError as error:
            errors.failed("%s; GPU metrics carry no pod labels meanwhile", error)
            return unknown
        errors.succeeded("pod resources answer again")
        return answer

    async def close(self) -> None:
        """Close the channel, if one was opened."""
        if self._client is not None:
            await self._client.close()
