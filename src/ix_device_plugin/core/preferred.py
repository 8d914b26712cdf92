"""GetPreferredAllocation policy: which of the available devices a container should get.

Rules, in order: every must-include device; devices on one NUMA node (the one the
must-include devices sit on, else the node that fits the request most tightly);
for time-sliced replicas, spread over distinct physical GPUs, least used first;
then the GPUs closest on PCIe to the first one chosen; then advertised order.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Sequence

from ix_device_plugin.core.allocation import AllocationError, resolve_ids
from ix_device_plugin.core.plan import Plan, PlannedDevice

_UNKNOWN_LINK = 1_000
_NO_NUMA = -1


def preferred(plan: Plan, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """Exactly `size` IDs from available, including must_include; raises AllocationError when impossible."""
    where = "preferred allocation"
    if size < 1:
        raise AllocationError(f"{where}: allocation_size must be at least 1, got {size}")
    candidates = {device.id: device for device in resolve_ids(plan, available, f"{where}: available_deviceIDs")}
    if size > len(candidates):
        raise AllocationError(f"{where}: allocation_size {size} is larger than the {len(candidates)} available")
    chosen = resolve_ids(plan, must_include, f"{where}: must_include_deviceIDs", allow_empty=True)
    missing = [device.id for device in chosen if device.id not in candidates]
    if missing:
        raise AllocationError(f"{where}: must-include device {missing[0]!r} is not in available_deviceIDs")
    if len(chosen) > size:
        raise AllocationError(f"{where}: {len(chosen)} must-include devices exceed allocation_size {size}")
    return [device.id for device in chosen] + _pick(plan, candidates, chosen, size - len(chosen))


def _numa(device: PlannedDevice) -> int:
    return device.numa_nodes[0] if len(device.numa_nodes) == 1 else _NO_NUMA


def _pick(plan: Plan, candidates: dict[str, PlannedDevice], chosen: list[PlannedDevice], count: int) -> list[str]:
    """count more IDs from candidates; the work is per physical GPU, not per replica."""
    if count == 0:
        return []
    offered: defaultdict[str, list[PlannedDevice]] = defaultdict(list)
    for device in candidates.values():
        offered[device.gpu].append(device)
    taken: Counter[str] = Counter()
    for device in chosen:
        offered[device.gpu].remove(device)
        taken[device.gpu] += 1
    per_gpu = {gpu: devices for gpu, devices in offered.items() if devices}
    numa = {gpu: _numa(devices[0]) for gpu, devices in per_gpu.items()}
    # Replicas of each GPU in use elsewhere (advertised but not offered), plus those chosen here.
    usage: Counter[str] = Counter()
    if plan.shared:
        for gpu, devices in per_gpu.items():
            usage[gpu] = plan.gpu_device_count[gpu] - len(devices)
    target = _target_numa(per_gpu, numa, chosen, count)
    anchor = chosen[0].gpu if chosen else _first_gpu(per_gpu, numa, target, usage)

    # One heap entry per GPU, keyed by how many of its replicas this request already took,
    # then by its total use: replicas spread over distinct GPUs, least used first.
    def key(gpu: str) -> tuple[int, int, int, int, int, str]:
        link = plan.gpu_link(anchor, gpu)
        off_numa = 0 if numa[gpu] == target else 1
        return (off_numa, taken[gpu], usage[gpu], _UNKNOWN_LINK if link is None else link, plan.gpu_order[gpu], gpu)

    heap = [key(gpu) for gpu in per_gpu]
    heapq.heapify(heap)
    picked: list[str] = []
    while len(picked) < count:
        gpu = heapq.heappop(heap)[-1]
        picked.append(_take_first_replica(per_gpu[gpu]).id)
        taken[gpu] += 1
        usage[gpu] += 1
        if per_gpu[gpu]:
            heapq.heappush(heap, key(gpu))
    return picked


def _take_first_replica(devices: list[PlannedDevice]) -> PlannedDevice:
    """Remove and return the lowest-numbered replica (callers take few, so no sort up front)."""
    index = min(range(len(devices)), key=lambda i: devices[i].replica or 0)
    devices[index], devices[-1] = devices[-1], devices[index]
    return devices.pop()


def _target_numa(
    per_gpu: dict[str, list[PlannedDevice]], numa: dict[str, int], chosen: list[PlannedDevice], count: int
) -> int:
    if chosen:
        return Counter(_numa(device) for device in chosen).most_common(1)[0][0]
    free: Counter[int] = Counter()
    for gpu, devices in per_gpu.items():
        free[numa[gpu]] += len(devices)
    fitting = [node for node, n in free.items() if n >= count and node != _NO_NUMA]
    if fitting:
        return min(fitting, key=lambda node: (free[node], node))
    return max(free, key=lambda node: (free[node], -node))


def _first_gpu(per_gpu: dict[str, list[PlannedDevice]], numa: dict[str, int], target: int, usage: Counter[str]) -> str:
    on_target = [gpu for gpu in per_gpu if numa[gpu] == target] or list(per_gpu)
    return min(on_target, key=lambda gpu: usage[gpu])
