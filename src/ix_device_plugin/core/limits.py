"""Limits that come from the plugin's consumers: the kubelet's 4 MiB gRPC message limit on ListAndWatch.

Pure arithmetic over the inventory and config: the size of the message a plan would produce is
computed without building the plan's device list, so a refused value costs nothing to refuse.
"""

from __future__ import annotations

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.plan import MAX_DEVICE_ID_LENGTH, REPLICA_SEPARATOR, physical_groups
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.values import MAX_REPLICAS

KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # grpc-go's default maximum receive size, which the kubelet keeps
_HEALTHY, _UNHEALTHY = len("Healthy"), len("Unhealthy")


def _varint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _field_size(length: int) -> int:
    """A length-delimited field with a one-byte tag: tag, length, bytes."""
    return 1 + _varint_size(length) + length


def _topology_size(numa_nodes: tuple[int, ...]) -> int:
    """The TopologyInfo message's size: one NUMANode per node (an ID of 0 is omitted, as proto3 does)."""
    return sum(_field_size(0 if node == 0 else 1 + _varint_size(node)) for node in numa_nodes)


def _device_size(id_length: int, health_length: int, topology: int | None) -> int:
    body = _field_size(id_length) + _field_size(health_length)
    if topology is not None:
        body += _field_size(topology)
    return _field_size(body)


def list_message_size(inventory: Inventory, config: Config, replicas: int | None = None) -> int:
    """The exact serialized size of the ListAndWatch response for inventory under config (replicas overriding)."""
    count = config.replicas if replicas is None else replicas
    ignored = config.health_policy
    total = 0
    for gpu, chips, shortfall in physical_groups(inventory, config.splitboard):
        unhealthy = bool(shortfall) or any(chip.status.reasons(ignored) for chip in chips)
        health = _UNHEALTHY if unhealthy else _HEALTHY
        numa = tuple(sorted({chip.numa_node for chip in chips if chip.numa_node is not None}))
        topology = _topology_size(numa) if numa else None
        for id_length, devices in _id_lengths(len(gpu), count):
            if id_length <= MAX_DEVICE_ID_LENGTH:
                total += devices * _device_size(id_length, health, topology)
    return total


def _id_lengths(gpu_length: int, replicas: int) -> list[tuple[int, int]]:
    """(ID length, how many devices have it) for one GPU: `<gpu>` alone, or `<gpu>::<i>` for i < replicas."""
    if replicas < 1:
        return [(gpu_length, 1)]
    lengths = []
    low, digits = 0, 1
    while low < replicas:
        high = min(replicas, 10**digits)
        lengths.append((gpu_length + len(REPLICA_SEPARATOR) + digits, high - low))
        low, digits = high, digits + 1
    return lengths


def largest_replicas_that_fit(inventory: Inventory, config: Config, limit: int = KUBELET_MAX_MESSAGE_BYTES) -> int:
    """The largest time-slicing replicas value whose device list fits in limit (0 when not even 1 does)."""
    if list_message_size(inventory, config, replicas=1) > limit:
        return 0
    low, high = 1, MAX_REPLICAS  # low fits
    while low < high:
        middle = (low + high + 1) // 2
        if list_message_size(inventory, config, replicas=middle) <= limit:
            low = middle
        else:
            high = middle - 1
    return low


def device_list_problem(inventory: Inventory, config: Config, limit: int = KUBELET_MAX_MESSAGE_BYTES) -> str | None:
    """Why the device list for inventory under config cannot be sent to the kubelet, or None when it can."""
    size = list_message_size(inventory, config)
    if size <= limit:
        return None
    best = largest_replicas_that_fit(inventory, config, limit)
    return (
        f"sharing.timeSlicing.replicas: {config.replicas} replicas on this node's {inventory.chip_count()} chips "
        f"would make a {size / 1e6:.1f} MB device list, over the kubelet's {limit // (1024 * 1024)} MiB limit; "
        f"the largest value that fits is {best}"
    )
