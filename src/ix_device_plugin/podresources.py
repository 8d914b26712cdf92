"""Which container holds which device: the kubelet's pod-resources API v1 (List), as dcgm-exporter and
ix-exporter read it."""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path

import grpc

from ix_device_plugin.api.podresources import api_pb2, api_pb2_grpc
from ix_device_plugin.registration import CHANNEL_OPTIONS, unix_target
from ix_device_plugin.telemetry import PodRef

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
MAX_MESSAGE = 16 * 1024 * 1024  # the kubelet answers for every pod of the node in one message


class PodResourcesError(Exception):
    """The pod-resources socket could not be read; the message says which and why."""


async def list_allocations(socket_path: Path, resource_names: Set[str], timeout: float) -> dict[str, PodRef]:
    """Device ID -> the container it is allocated to, for devices of resource_names; PodResourcesError."""
    options = (*CHANNEL_OPTIONS, ("grpc.max_receive_message_length", MAX_MESSAGE))
    async with grpc.aio.insecure_channel(unix_target(socket_path), options=options) as channel:
        try:
            response = await api_pb2_grpc.PodResourcesListerStub(channel).List(
                api_pb2.ListPodResourcesRequest(), timeout=timeout
            )
        except grpc.aio.AioRpcError as error:
            raise PodResourcesError(f"pod resources {socket_path}: {error.code().name}: {error.details()}") from None
    allocations: dict[str, PodRef] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name in resource_names:
                    for device_id in devices.device_ids:
                        allocations[device_id] = PodRef(pod.namespace, pod.name, container.name)
    return allocations
