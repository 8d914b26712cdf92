"""GetPreferredAllocation policy: which of the available devices a container should get.

Rules, in order: every must-include device; devices on one NUMA node (the one the
must-include devices sit on, else the node that fits the request most tightly);
for time-sliced replicas, spread over distinct physical GPUs, least used first;
then the GPUs closest on PCIe to the first one chosen; then advertised order.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence

from ix_device_plugin.allocation import AllocationError
from ix_device_plugin.plan import Plan, PlannedDevice

_UNKNOWN_LINK = 1_000
_NO_NUMA = -1


def preferred(plan: Plan, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """Exactly `size` IDs from available, including must_include; raises AllocationError when impossible."""
    where = "preferred allocation"
    if size < 1:
        raise AllocationError(f"{where}: allocation_size must be at least 1, got {size}")
    candidates = _known(plan, available, f"{where}: available_deviceIDs")
    if size > len(candidates):
        raise AllocationError(f"{where}: allocation_size {size} is larger than the {len(candidates)} available")
    chosen = list(_known(plan, must_include, f"{where}: must_include_deviceIDs").values())
    missing = [device.id for device in chosen if device.id not in candidates]
    if missing:
        raise AllocationError(f"{where}: must-include device {missing[0]!r} is not in available_deviceIDs")
    if len(chosen) > size:
        raise AllocationError(f"{where}: {len(chosen)} must-include devices exceed allocation_size {size}")
    return [device.id for device in chosen] + _pick(plan, candidates, chosen, size - len(chosen))


def _known(plan: Plan, device_ids: Sequence[str], where: str) -> dict[str, PlannedDevice]:
    devices: dict[str, PlannedDevice] = {}
    for device_id in device_ids:
        device = plan.by_id.get(device_id)
        if device is None:
            raise AllocationError(f"{where}: unknown device ID {device_id!r} for {plan.resource_name}")
        devices[device_id] = device
    return devices


def _numa(device: PlannedDevice) -> int:
    return device.numa_nodes[0] if len(device.numa_nodes) == 1 else _NO_NUMA


def _pick(plan: Plan, candidates: dict[str, PlannedDevice], chosen: list[PlannedDevice], count: int) -> list[str]:
    if count == 0:
        return []
    chosen_ids = {device.id for device in chosen}
    pool = [device for device in candidates.values() if device.id not in chosen_ids]
    target = _target_numa(pool, chosen, count)
    usage = _usage(plan, candidates, chosen)
    anchor = chosen[0].gpu if chosen else _first_gpu(pool, target, usage)
    order = {device.id: index for index, device in enumerate(plan.devices)}

    # One heap entry per physical GPU, keyed by how many of its replicas this request already
    # took, then by its total use: replicas spread over distinct GPUs, least used first.
    per_gpu: dict[str, list[PlannedDevice]] = {}
    for device in sorted(pool, key=lambda d: order[d.id], reverse=True):
        per_gpu.setdefault(device.gpu, []).append(device)
    taken: Counter[str] = Counter(device.gpu for device in chosen)

    def key(gpu: str) -> tuple[int, int, int, int, int, str]:
        device = per_gpu[gpu][-1]
        link = plan.gpu_link(anchor, gpu)
        off_numa = 0 if _numa(device) == target else 1
        return (off_numa, taken[gpu], usage[gpu], _UNKNOWN_LINK if link is None else link, order[device.id], gpu)

    heap = [key(gpu) for gpu in per_gpu]
    heapq.heapify(heap)
    picked: list[str] = []
    while len(picked) < count:
        gpu = heapq.heappop(heap)[-1]
        picked.append(per_gpu[gpu].pop().id)
        taken[gpu] += 1
        usage[gpu] += 1
        if per_gpu[gpu]:
            heapq.heappush(heap, key(gpu))
    return picked


def _usage(plan: Plan, candidates: dict[str, PlannedDevice], chosen: list[PlannedDevice]) -> Counter[str]:
    """Replicas of each GPU already in use: advertised but not available, plus those chosen."""
    usage: Counter[str] = Counter()
    if plan.shared:
        for device in plan.devices:
            if device.id not in candidates:
                usage[device.gpu] += 1
    for device in chosen:
        usage[device.gpu] += 1
    return usage


def _target_numa(pool: list[PlannedDevice], chosen: list[PlannedDevice], count: int) -> int:
    if chosen:
        return Counter(_numa(device) for device in chosen).most_common(1)[0][0]
    free = Counter(_numa(device) for device in pool)
    fitting = [node for node, n in free.items() if n >= count and node != _NO_NUMA]
    if fitting:
        return min(fitting, key=lambda node: (free[node], node))
    return max(free, key=lambda node: (free[node], -node))


def _first_gpu(pool: list[PlannedDevice], target: int, usage: Counter[str]) -> str:
    on_target = [device for device in pool if _numa(device) == target] or pool
    return min(on_target, key=lambda device: usage[device.gpu]).gpu
