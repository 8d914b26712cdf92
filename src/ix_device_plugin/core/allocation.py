"""What goes into a container that was given some devices: device nodes and environment.

Pure: reads a Plan, never the hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ix_device_plugin.core.cdi import annotations as cdi_annotations
from ix_device_plugin.core.cdi import qualified_names
from ix_device_plugin.core.plan import Plan, PlannedDevice
from ix_device_plugin.settings.devicelist import CDI_ANNOTATIONS, CDI_CRI, DEVICE_SPECS

VISIBLE_DEVICES_ENV = "IX_VISIBLE_DEVICES"
REPLICA_DEVICES_ENV = "IX_REPLICA_DEVICES"
# The names CoreX releases before 4.4 read; set to the same values.
LEGACY_VISIBLE_DEVICES_ENV = "ILUVATAR_COREX_VISIBLE_DEVICES"
LEGACY_REPLICA_DEVICES_ENV = "ILUVATAR_COREX_REPLICA_DEVICES"
DEVICE_PERMISSIONS = "rw"
DEVICE_NODE_PREFIX = "/dev/iluvatar"


class AllocationError(ValueError):
    """A request that cannot be answered; `unavailable` when the devices exist but are unusable."""

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


@dataclass(frozen=True)
class ContainerAllocation:
    """For one container: device nodes as (host path, container path), opened rw, environment variables,
    and the CDI device names (as CDI devices for the runtime, or as an annotation) per the device list strategy."""

    device_specs: tuple[tuple[str, str], ...]
    envs: dict[str, str]
    cdi_devices: tuple[str, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def device_nodes(self) -> tuple[str, ...]:
        """The host paths of the device nodes."""
        return tuple(host for host, _ in self.device_specs)


def allocate(plan: Plan, device_ids: Sequence[str], container: int = 0) -> ContainerAllocation:
    """What container number `container` gets for device_ids; raises AllocationError naming the bad ID."""
    devices = resolve_ids(plan, device_ids, f"container request {container}")
    _check_usable(plan, devices, container)
    nodes: list[str] = []
    uuids: list[str] = []
    for device in devices:
        for chip in device.chips:
            if chip.uuid in uuids:
                continue
            uuids.append(chip.uuid)
            if chip.device_node is not None:
                nodes.append(chip.device_node)
    specs = _whole_node_order(nodes) if _takes_whole_node(plan, devices) else [(node, node) for node in nodes]
    specs.extend((node, node) for node in plan.control_nodes)
    visible = ",".join(uuids)
    replicas = ",".join(device_ids)
    envs = {
        VISIBLE_DEVICES_ENV: visible,
        REPLICA_DEVICES_ENV: replicas,
        LEGACY_VISIBLE_DEVICES_ENV: visible,
        LEGACY_REPLICA_DEVICES_ENV: replicas,
    }
    strategy = plan.device_list_strategy
    names = qualified_names(uuids)
    return ContainerAllocation(
        device_specs=tuple(specs) if DEVICE_SPECS in strategy else (),
        envs=envs,
        cdi_devices=tuple(names) if CDI_CRI in strategy else (),
        annotations=cdi_annotations(names, _response_id(device_ids)) if CDI_ANNOTATIONS in strategy else {},
    )


def _response_id(device_ids: Sequence[str]) -> str:
    """A stable ID for one container's response, for the CDI annotation key (pure: no random UUID)."""
    import hashlib  # OpenSSL's hashes, 0.6 MiB of memory: loaded with the CDI annotations' strategy only

    return hashlib.sha256(",".join(device_ids).encode()).hexdigest()[:16]


def _takes_whole_node(plan: Plan, devices: list[PlannedDevice]) -> bool:
    """Every GPU of the node and no time-slicing (any `replicas`, 1 included, keeps host paths, as in Iluvatar's)."""
    return plan.replicas == 0 and len(devices) == len(plan.devices) > 0


def _whole_node_order(nodes: list[str]) -> list[tuple[str, str]]:
    """A container given every GPU of the node sees them as /dev/iluvatar0..N-1, in host minor order.

    Software in the container (as on a bare-metal host with the same GPUs) enumerates from 0;
    host paths are unchanged.
    """
    by_minor = sorted(nodes, key=lambda node: int(node.removeprefix(DEVICE_NODE_PREFIX)))
    return [(node, f"{DEVICE_NODE_PREFIX}{index}") for index, node in enumerate(by_minor)]


def resolve_ids(plan: Plan, device_ids: Sequence[str], where: str, *, allow_empty: bool = False) -> list[PlannedDevice]:
    """The planned devices for device_ids, in order, rejecting duplicate and unknown IDs (and none, unless allowed)."""
    if not device_ids and not allow_empty:
        raise AllocationError(f"{where}: no device IDs given")
    ids = list(device_ids)  # a protobuf field makes a new str for each item at each pass: one pass
    unique = set(ids)
    if len(unique) == len(ids) and unique <= plan.by_id.keys():
        return list(map(plan.by_id.__getitem__, ids))  # the common case, without a Python loop per ID
    return _resolve_one_by_one(plan, ids, where)


def _resolve_one_by_one(plan: Plan, device_ids: list[str], where: str) -> list[PlannedDevice]:
    """resolve_ids for a request with a duplicate or unknown ID: finds the first, to say which."""
    seen: set[str] = set()
    devices: list[PlannedDevice] = []
    for device_id in device_ids:
        if device_id in seen:
            raise AllocationError(f"{where}: device ID {device_id!r} requested twice")
        seen.add(device_id)
        device = plan.by_id.get(device_id)
        if device is None:
            raise AllocationError(f"{where}: unknown device ID {_shown(device_id)} for {plan.resource_name}")
        devices.append(device)
    return devices


def _shown(device_id: str) -> str:
    return repr(device_id if len(device_id) <= 80 else device_id[:77] + "...")


def _check_usable(plan: Plan, devices: list[PlannedDevice], container: int) -> None:
    if plan.shared and plan.fail_requests_greater_than_one and len(devices) > 1:
        raise AllocationError(
            f"container request {container}: asks for {len(devices)} shared {plan.resource_name} devices, "
            "but failRequestsGreaterThanOne is set: time-sliced replicas give no more compute than one, "
            "so request 1"
        )
    for device in devices:
        if not device.healthy:
            reasons = "; ".join(device.reasons)
            raise AllocationError(
                f"container request {container}: device {device.id} is Unhealthy ({reasons})", unavailable=True
            )
    missing = [chip.uuid for device in devices for chip in device.chips if chip.device_node is None]
    if missing:
        raise AllocationError(
            f"container request {container}: chip {missing[0]} has no known device node", unavailable=True
        )
