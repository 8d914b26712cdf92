"""GetPreferredAllocation policy: which of the available devices a container should get.

Whole GPUs (no time-slicing): every must-include device, and of the sets of the requested size that hold
them, the best placed (core.placement: fewest pairs across CPUs, then across NUMA nodes, host bridges, PCIe
switches, boards); of sets placed equally well, the one that leaves the free GPUs best placed, then one
fixed by the plan. The answer depends on which devices are offered, never on the order they come in.

Time-sliced replicas: every must-include device; devices on one NUMA node (the one the must-include devices
sit on, else the node that fits the request most tightly); spread over distinct physical GPUs, least used
first; then the GPUs closest to the first one chosen (same board, PCIe switch, host bridge); then
advertised order.

The kubelet offers every free device (thousands with time-slicing) and asks for a few, so the offered
IDs are checked and shared out per GPU by set operations, with no Python step per offered ID.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence

from ix_device_plugin.core.allocation import AllocationError, resolve_ids
from ix_device_plugin.core.placement import best_placed
from ix_device_plugin.core.plan import Plan, PlannedDevice

_NO_NUMA = -1
_SAME_GPU = -1  # closer than any level: another replica of the GPU itself


def preferred(plan: Plan, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """Exactly `size` IDs from available, including must_include; raises AllocationError when impossible."""
    where = "preferred allocation"
    if size < 1:
        raise AllocationError(f"{where}: allocation_size must be at least 1, got {size}")
    offered = list(available)  # a protobuf field makes a new str for each item at each pass: one pass
    free = set(offered)
    per_gpu = _free_per_gpu(plan, free)
    if not free or len(free) != len(offered) or sum(map(len, per_gpu.values())) != len(free):
        resolve_ids(plan, offered, f"{where}: available_deviceIDs")  # says what is wrong: none, repeated, unknown
    if size > len(free):
        raise AllocationError(f"{where}: allocation_size {size} is larger than the {len(free)} available")
    chosen = resolve_ids(plan, must_include, f"{where}: must_include_deviceIDs", allow_empty=True)
    missing = [device.id for device in chosen if device.id not in free]
    if missing:
        raise AllocationError(f"{where}: must-include device {missing[0]!r} is not in available_deviceIDs")
    if len(chosen) > size:
        raise AllocationError(f"{where}: {len(chosen)} must-include devices exceed allocation_size {size}")
    if not plan.shared:
        return _best_placed(plan, per_gpu, chosen, size)
    return [device.id for device in chosen] + _pick(plan, offered, per_gpu, chosen, size - len(chosen))


def _best_placed(plan: Plan, per_gpu: dict[str, set[str]], chosen: list[PlannedDevice], size: int) -> list[str]:
    """The must-include devices, then the others of the best placed set of whole GPUs in advertised order."""
    must = {device.gpu for device in chosen}
    gpus = best_placed(plan.topology, per_gpu.keys(), must, size)
    others = sorted((gpu for gpu in gpus if gpu not in must), key=plan.gpu_order.__getitem__)
    return [device.id for device in chosen] + [min(per_gpu[gpu]) for gpu in others]


def _free_per_gpu(plan: Plan, free: set[str]) -> dict[str, set[str]]:
    """The free IDs of each GPU that has any, GPUs in advertised order."""
    per_gpu = {gpu: free.intersection(ids) for gpu, ids in plan.gpu_device_ids.items()}
    return {gpu: ids for gpu, ids in per_gpu.items() if ids}


def _numa(device: PlannedDevice) -> int:
    return device.numa_nodes[0] if len(device.numa_nodes) == 1 else _NO_NUMA


def _pick(
    plan: Plan, offered: list[str], per_gpu: dict[str, set[str]], chosen: list[PlannedDevice], count: int
) -> list[str]:
    """count more time-sliced replicas from per_gpu (the free IDs of each GPU; offered: them all, as the kubelet
    listed them)."""
    if count == 0:
        return []
    taken: Counter[str] = Counter()
    for device in chosen:
        per_gpu[device.gpu].discard(device.id)
        taken[device.gpu] += 1
    per_gpu = {gpu: ids for gpu, ids in per_gpu.items() if ids}
    numa = {gpu: _numa(plan.by_id[plan.gpu_device_ids[gpu][0]]) for gpu in per_gpu}
    # Replicas of each GPU in use elsewhere (advertised but not offered), plus those chosen here.
    usage = Counter({gpu: len(plan.gpu_device_ids[gpu]) - len(ids) for gpu, ids in per_gpu.items()})
    target = _target_numa(per_gpu, numa, chosen, count)
    anchor = chosen[0].gpu if chosen else _first_gpu(plan, offered, per_gpu, numa, target, usage)

    # One heap entry per GPU, keyed by how many of its replicas this request already took,
    # then by its total use: replicas spread over distinct GPUs, least used first.
    def key(gpu: str) -> tuple[int, int, int, int, int, str]:
        distance = _SAME_GPU if gpu == anchor else plan.topology.shared_level(anchor, gpu)
        off_numa = 0 if numa[gpu] == target else 1
        return (off_numa, taken[gpu], usage[gpu], distance, plan.gpu_order[gpu], gpu)

    heap = [key(gpu) for gpu in per_gpu]
    heapq.heapify(heap)
    picked: list[str] = []
    while len(picked) < count:
        gpu = heapq.heappop(heap)[-1]
        picked.append(_take_first_replica(plan, gpu, per_gpu[gpu]))
        taken[gpu] += 1
        usage[gpu] += 1
        if per_gpu[gpu]:
            heapq.heappush(heap, key(gpu))
    return picked


def _take_first_replica(plan: Plan, gpu: str, free: set[str]) -> str:
    """Remove and return the GPU's lowest-numbered free replica."""
    device_id = next(device_id for device_id in plan.gpu_device_ids[gpu] if device_id in free)
    free.remove(device_id)
    return device_id


def _target_numa(per_gpu: dict[str, set[str]], numa: dict[str, int], chosen: list[PlannedDevice], count: int) -> int:
    if chosen:
        return Counter(_numa(device) for device in chosen).most_common(1)[0][0]
    free: Counter[int] = Counter()
    for gpu, ids in per_gpu.items():
        free[numa[gpu]] += len(ids)
    fitting = [node for node, n in free.items() if n >= count and node != _NO_NUMA]
    if fitting:
        return min(fitting, key=lambda node: (free[node], node))
    return max(free, key=lambda node: (free[node], -node))


def _first_gpu(
    plan: Plan, offered: list[str], per_gpu: dict[str, set[str]], numa: dict[str, int], target: int, usage: Counter[str]
) -> str:
    """The least used GPU on the target node (any node when none is there); of equals, the first offered."""
    on_target = [gpu for gpu in per_gpu if numa[gpu] == target] or list(per_gpu)
    least = min(usage[gpu] for gpu in on_target)
    tied = {gpu for gpu in on_target if usage[gpu] == least}
    if len(tied) == 1:
        return tied.pop()
    return next(gpu for gpu in (plan.by_id[device_id].gpu for device_id in offered) if gpu in tied)
