"""From what the node has and what the operator asked for, to what the kubelet is told.

`plan(inventory, config)` is pure: the same inputs always give the same Plan.
A Plan is immutable; the server swaps it whole when anything changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from ix_device_plugin.core.inventory import Board, Chip, Inventory, link_key
from ix_device_plugin.core.products import expected_chips
from ix_device_plugin.core.topology import Topology, build_topology
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.devicelist import DEVICE_SPECS

MAX_DEVICE_ID_LENGTH = 63
REPLICA_SEPARATOR = "::"


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    """One advertised device: a board, a chip, or a time-sliced replica of either."""

    id: str
    gpu: str  # the physical GPU behind it: board UUID, or chip UUID when split
    chips: tuple[Chip, ...]
    reasons: tuple[str, ...]  # why it is Unhealthy; empty when Healthy
    numa_nodes: tuple[int, ...]
    replica: int | None = None

    @property
    def healthy(self) -> bool:
        """True when every chip behind the device is usable."""
        return not self.reasons


@dataclass(frozen=True)
class Plan:
    """What is advertised, and everything Allocate needs to answer without touching hardware."""

    resource_name: str
    devices: tuple[PlannedDevice, ...]
    replicas: int = 0
    fail_requests_greater_than_one: bool = False
    device_list_strategy: tuple[str, ...] = (DEVICE_SPECS,)
    control_nodes: tuple[str, ...] = ()
    # PCIe common-ancestor level between physical GPUs (sorted pair); lower is closer.
    gpu_links: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # The board each split chip sits on (GPU -> board UUID), for chips whose board has others.
    gpu_boards: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    by_id: Mapping[str, PlannedDevice] = field(init=False, repr=False, compare=False)
    gpu_order: Mapping[str, int] = field(init=False, repr=False, compare=False)  # GPU -> advertised order
    # GPU -> the IDs of its devices (replicas in order), in advertised order.
    gpu_device_ids: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {device.id: device for device in self.devices})
        by_gpu: dict[str, list[str]] = {}
        for device in self.devices:
            by_gpu.setdefault(device.gpu, []).append(device.id)
        object.__setattr__(self, "gpu_device_ids", {gpu: tuple(ids) for gpu, ids in by_gpu.items()})
        object.__setattr__(self, "gpu_order", {gpu: index for index, gpu in enumerate(by_gpu)})

    @cached_property
    def topology(self) -> Topology:
        """Where the physical GPUs sit (built at first use: only preferred allocation needs it)."""
        numa_nodes = {gpu: self.by_id[ids[0]].numa_nodes for gpu, ids in self.gpu_device_ids.items()}
        numa = {gpu: nodes[0] for gpu, nodes in numa_nodes.items() if len(nodes) == 1}
        boards = {gpu: board for gpu, board in self.gpu_boards.items() if gpu in numa_nodes}
        return build_topology(list(numa_nodes), boards, numa, self.gpu_links)

    @property
    def shared(self) -> bool:
        """True when a GPU can go to several containers at once (replicas >= 2; with 1, devices are named as
        replicas, one per GPU, and nothing is shared)."""
        return self.replicas >= 2

    def capacity(self) -> int:
        """Number of devices advertised (what `kubectl describe node` shows as capacity)."""
        return len(self.devices)

    def healthy_count(self) -> int:
        """Number of advertised devices that are Healthy (allocatable)."""
        return sum(1 for device in self.devices if device.healthy)

    def gpu_link(self, gpu_a: str, gpu_b: str) -> int | None:
        """PCIe common-ancestor level between two physical GPUs, None when unknown."""
        if gpu_a == gpu_b:
            return 0
        return self.gpu_links.get(link_key(gpu_a, gpu_b))


def plan(inventory: Inventory, config: Config) -> Plan:
    """The devices to advertise for inventory under config (see the README's capacity table)."""
    ignored = config.health_policy
    groups = physical_groups(inventory, config.splitboard)
    replicas = config.replicas
    devices: list[PlannedDevice] = []
    warnings: list[str] = []
    for gpu, chips, shortfall in groups:
        reasons = tuple(f"{chip.uuid}: {reason}" for chip in chips for reason in chip.status.reasons(ignored))
        reasons += shortfall
        numa = tuple(sorted({chip.numa_node for chip in chips if chip.numa_node is not None}))
        for device_id, replica in _device_ids(gpu, replicas):
            if len(device_id) > MAX_DEVICE_ID_LENGTH:
                warnings.append(f"device {device_id} not advertised: ID longer than {MAX_DEVICE_ID_LENGTH}")
                continue
            devices.append(PlannedDevice(device_id, gpu, chips, reasons, numa, replica))
    return Plan(
        resource_name=config.advertised_resource_name,
        devices=tuple(devices),
        replicas=replicas,
        fail_requests_greater_than_one=config.fail_requests_greater_than_one,
        device_list_strategy=config.device_list_strategy,
        control_nodes=inventory.control_nodes,
        gpu_links=_gpu_links(inventory, groups),
        gpu_boards=_gpu_boards(inventory) if config.splitboard else {},
        warnings=tuple(warnings),
    )


Group = tuple[str, tuple[Chip, ...], tuple[str, ...]]  # physical GPU, its chips, why it is short of chips


def physical_groups(inventory: Inventory, splitboard: bool) -> list[Group]:
    """The physical GPUs to advertise: boards, or chips when split; a short board says what it lacks."""
    if splitboard:
        return [(chip.uuid, (chip,), ()) for chip in inventory.chips()]
    return [(board.uuid, board.chips, shortfall(board)) for board in inventory.boards]


def shortfall(board: Board, product: str | None = None) -> tuple[str, ...]:
    """The reason a board whose chips were not all enumerated is Unhealthy, naming it product (its own by
    default); none when every chip is there."""
    expected = expected_chips(board)
    present = sum(1 for chip in board.chips if chip.status.present)
    if len(board.chips) >= expected:
        return ()  # any chip not present already says so
    return (f"chip missing ({present} of {expected} chips of the {product or board.product} enumerated)",)


def _device_ids(gpu: str, replicas: int) -> list[tuple[str, int | None]]:
    """The GPU's device IDs as Iluvatar's plugin 4.4.0 names them (gpuallocator.buildDevice): the UUID alone
    without replicas, `<uuid>::<i>` for i < replicas with any replicas, 1 included."""
    if replicas < 1:
        return [(gpu, None)]
    return [(f"{gpu}{REPLICA_SEPARATOR}{i}", i) for i in range(replicas)]


def _gpu_boards(inventory: Inventory) -> dict[str, str]:
    """Each chip of a board of several (that the library placed) -> the board's UUID."""
    return {
        chip.uuid: board.uuid
        for board in inventory.boards
        if board.membership_known and len(board.chips) > 1
        for chip in board.chips
    }


def _gpu_links(inventory: Inventory, groups: list[Group]) -> dict[tuple[str, str], int]:
    if not inventory.links:
        return {}
    links: dict[tuple[str, str], int] = {}
    for i, (gpu_a, chips_a, _) in enumerate(groups):
        for gpu_b, chips_b, _ in groups[i + 1 :]:
            levels = [level for a in chips_a for b in chips_b if (level := inventory.link(a.uuid, b.uuid)) is not None]
            if levels:
                links[link_key(gpu_a, gpu_b)] = min(levels)
    return links
