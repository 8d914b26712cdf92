"""Where the physical GPUs sit relative to each other: groups nested from a board up to the whole node.

Built once per plan from what the inventory says: which chips share a board, each pair's PCIe
common-ancestor level, each GPU's NUMA node. A level's groups join the GPUs that any chain of those facts
places within that level of each other (single linkage), so each level's groups lie inside the next
level's even where the facts disagree.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from ix_device_plugin.core.inventory import (
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_MULTIPLE,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
)

# The levels, closest first. Two GPUs share the first level whose group holds both.
BOARD, SWITCH, SWITCHES, HOST_BRIDGE, NUMA_NODE, CPUS, NODE = range(7)
LEVELS = NODE + 1
LEVEL_NAMES = (
    "board",
    "PCIe switch",
    "PCIe switches",
    "host bridge",
    "NUMA node",
    "CPUs",  # across the CPU interconnect: both GPUs' places are known
    "node",  # nothing known joins them
)
# The PCIe common-ancestor level (NVML's scale) that each level allows, up to CPUS.
_LINK_LIMITS = (
    TOPOLOGY_INTERNAL,
    TOPOLOGY_SINGLE,
    TOPOLOGY_MULTIPLE,
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_NODE,
    TOPOLOGY_SYSTEM,
)
_LOCATED = ("located",)  # joins, at the CPUS level, every GPU whose NUMA node is known


@dataclass(frozen=True, slots=True)
class Group:
    """Two or more GPUs sharing a level, or the whole node.

    levels: the levels it is the group of (one that is also the whole of its group at the next level stands
    for both); gpus: the GPUs it holds that are in no smaller group; groups: the smaller groups it holds
    (index in Topology.groups). Both in advertised order of their first GPU.
    """

    levels: tuple[int, ...]
    gpus: tuple[str, ...]
    groups: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    """The GPUs' groups at every level.

    paths: each GPU's group at each level below NODE, closest first, a group named by the advertised index
    of its first GPU. groups: every group of two or more GPUs, each after the groups it holds; the whole
    node last.
    """

    paths: Mapping[str, tuple[int, ...]]
    groups: tuple[Group, ...]

    def shared_level(self, gpu_a: str, gpu_b: str) -> int:
        """The closest level whose group holds both GPUs (BOARD for one GPU, NODE when nothing joins them)."""
        # Groups nest: the two paths differ up to the level they share, and agree from there.
        return sum(map(operator.ne, self.paths[gpu_a], self.paths[gpu_b]))


def build_topology(
    gpus: Sequence[str],
    boards: Mapping[str, str],
    numa: Mapping[str, int],
    links: Mapping[tuple[str, str], int],
) -> Topology:
    """The topology of gpus (advertised order) from the board each sits on (absent: a board of its own), its
    NUMA node (absent: unknown) and the PCIe common-ancestor level of pairs (absent: unknown)."""
    joins: list[list[tuple[Hashable, Hashable]]] = [[] for _ in range(NODE)]
    joins[BOARD].extend((gpu, ("board", board)) for gpu, board in boards.items())
    for (gpu_a, gpu_b), value in links.items():
        level = _link_level(value)
        if level is not None:
            joins[level].append((gpu_a, gpu_b))
    joins[NUMA_NODE].extend((gpu, ("numa", node)) for gpu, node in numa.items())
    joins[CPUS].extend((gpu, _LOCATED) for gpu in numa)
    known = set(gpus)
    sets = _DisjointSets(gpus)
    keys: list[dict[str, int]] = []
    for level_joins in joins:
        for item_a, item_b in level_joins:
            if (isinstance(item_a, tuple) or item_a in known) and (isinstance(item_b, tuple) or item_b in known):
                sets.union(item_a, item_b)
        keys.append(sets.keys(gpus))
    paths = {gpu: tuple(level_keys[gpu] for level_keys in keys) for gpu in gpus}
    return Topology(paths=paths, groups=_nest(gpus, [*keys, dict.fromkeys(gpus, 0)]))


def _link_level(value: int) -> int | None:
    """The closest level a PCIe common-ancestor level allows; None for a value outside NVML's scale."""
    if value < 0:
        return None
    return next((level for level, limit in enumerate(_LINK_LIMITS) if value <= limit), None)


def _nest(gpus: Sequence[str], keys: list[dict[str, int]]) -> tuple[Group, ...]:
    """The groups of two or more GPUs at each level, a group that only renames its one child folded into it."""
    levels: list[list[int]] = []
    children: list[tuple[str | int, ...]] = []
    holder: dict[str, str | int] = {gpu: gpu for gpu in gpus}  # the GPU's group (or itself) so far
    for level, level_keys in enumerate(keys):
        members: dict[int, list[str]] = {}
        for gpu in gpus:
            members.setdefault(level_keys[gpu], []).append(gpu)
        for group_gpus in members.values():
            held = tuple(dict.fromkeys(holder[gpu] for gpu in group_gpus))
            if len(held) == 1 and isinstance(held[0], int):
                levels[held[0]].append(level)
                continue
            if len(held) == 1 and level < NODE:
                continue  # one GPU alone
            levels.append([level])
            children.append(held)
            for gpu in group_gpus:
                holder[gpu] = len(children) - 1
    return tuple(
        Group(
            levels=tuple(group_levels),
            gpus=tuple(child for child in held if isinstance(child, str)),
            groups=tuple(child for child in held if isinstance(child, int)),
        )
        for group_levels, held in zip(levels, children, strict=True)
    )


class _DisjointSets:
    """Union-find over GPUs and the facts that join them."""

    def __init__(self, items: Sequence[Hashable]) -> None:
        self._parent: dict[Hashable, Hashable] = {item: item for item in items}

    def find(self, item: Hashable) -> Hashable:
        parent = self._parent.setdefault(item, item)
        while parent != item:
            grandparent = self._parent[parent]
            self._parent[item] = grandparent
            item, parent = parent, grandparent
        return item

    def union(self, item_a: Hashable, item_b: Hashable) -> None:
        root_a, root_b = self.find(item_a), self.find(item_b)
        if root_a != root_b:
            self._parent[root_b] = root_a

    def keys(self, gpus: Sequence[str]) -> dict[str, int]:
        """Each GPU's set, named by the index of the set's first GPU in gpus."""
        first: dict[Hashable, int] = {}
        return {gpu: first.setdefault(self.find(gpu), index) for index, gpu in enumerate(gpus)}
