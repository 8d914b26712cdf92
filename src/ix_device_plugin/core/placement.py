"""How well a set of GPUs is placed, and the best placed set of a given size among the free ones.

The placement score of a set: for each level from the farthest in (across CPUs, NUMA node, host bridge,
PCIe switches, PCIe switch, board), how many pairs of its GPUs do not share a group at that level. Lower is
better, compared level by level from the farthest: a set that fits in one board beats one that fits under
one PCIe switch, which beats one that fits on one NUMA node; a set too large for one group keeps as few
pairs apart as it can at the farthest level first (two whole boards under one bridge beat four chips from
four boards under it).

The search is exact for this score: the score adds up over groups (a group whose GPUs are all chosen
or none adds nothing), so the best choice of n GPUs inside a group is the best split of n over its
children, found bottom-up over the groups (a knapsack over each group's children, at most the request
size wide). Interchangeable children (same table of best scores) past the request size are never needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass
from math import comb

from ix_device_plugin.core.topology import NODE, Topology

# A GPU as a child: one free GPU, taken or not; one that must be taken.
_FREE_GPU: tuple[int | None, ...] = (0, 0)
_MUST_GPU: tuple[int | None, ...] = (None, 0)


def placement(topology: Topology, gpus: Iterable[str]) -> tuple[int, ...]:
    """The placement score of gpus (a GPU named twice is one place): the pairs apart at each level, farthest
    level first. Lower is better, compared as tuples."""
    paths = [topology.paths[gpu] for gpu in gpus]
    apart = []
    for level in reversed(range(NODE)):
        together: dict[int, int] = {}
        for path in paths:
            together[path[level]] = together.get(path[level], 0) + 1
        apart.append(comb(len(paths), 2) - sum(comb(count, 2) for count in together.values()))
    return tuple(apart)


@dataclass(frozen=True, slots=True)
class _Table:
    """A group's best score for each number of its free GPUs taken, and how each was split over its children
    (one list per child, in the order merged: the number the child gives for each total so far)."""

    best: tuple[int | None, ...]
    free: int
    splits: tuple[tuple[str | int, list[int]], ...]


def best_placed(topology: Topology, free: Set[str], must: Set[str], size: int) -> list[str]:
    """size GPUs of free, every GPU of must among them, with the best placement score; of sets placed
    equally well, the one that leaves the rest of free best placed, then the earliest advertised.

    Needs 1 <= size <= len(free) and len(must) <= size, must within free.
    """
    weights = _Weights(len(topology.paths))
    tables: dict[int, _Table] = {}
    for index, group in enumerate(topology.groups):
        table = _group_table(group.children, tables, free, must, size)
        if table is not None:
            tables[index] = weights.scored(table, group.levels, size)
    root = tables[len(topology.groups) - 1]
    if size >= len(root.best) or root.best[size] is None:
        raise ValueError(f"no {size} of {len(free)} free GPUs hold the {len(must)} that must be taken")
    chosen: list[str] = []
    _collect(root, size, tables, chosen)
    return chosen


class _Weights:
    """Turns a group's pairs taken and left at its levels into one integer whose order is the score's.

    Every level's count is below `base`, so the pairs taken at each level (farthest first) are the most
    significant digits, then the pairs left free (farthest first).
    """

    def __init__(self, gpus: int) -> None:
        base = gpus * gpus + 1
        self._taken = [base ** (NODE + 1 + level) for level in range(NODE + 1)]
        self._left = [base**level for level in range(NODE + 1)]

    def scored(self, table: _Table, levels: tuple[int, ...], size: int) -> _Table:
        """table with the group's own pairs added for each number taken."""
        taken = sum(self._taken[level] for level in levels)
        left = sum(self._left[level] for level in levels)
        total = table.free
        best = tuple(
            None if value is None else value + comb(n, 2) * taken + comb(total - n, 2) * left
            for n, value in enumerate(table.best)
        )
        return _Table(best, total, table.splits)


def _group_table(
    group_children: tuple[str | int, ...], tables: dict[int, _Table], free: Set[str], must: Set[str], size: int
) -> _Table | None:
    """The best split of each number of a group's free GPUs over its children; None when none is free."""
    children: list[tuple[str | int, tuple[int | None, ...]]] = []
    total = 0
    seen: dict[tuple[int | None, ...], int] = {}
    for child in group_children:
        if isinstance(child, str):
            if child not in free:
                continue
            best, count = (_MUST_GPU if child in must else _FREE_GPU), 1
        else:
            table = tables.get(child)
            if table is None:
                continue
            best, count = table.best, table.free
        total += count
        if best[0] is not None:  # a child that may give none: only the first `size` of its kind can matter
            seen[best] = seen.get(best, 0) + 1
            if seen[best] > size:
                continue
        children.append((child, best))
    if not children:
        return None
    width = min(size, total) + 1
    merged: list[int | None] = [0] + [None] * (width - 1)
    splits = []
    for child, best in children:
        merged, given = _merge(merged, best, width)
        splits.append((child, given))
    return _Table(tuple(merged), total, tuple(splits))


def _merge(merged: list[int | None], best: tuple[int | None, ...], width: int) -> tuple[list[int | None], list[int]]:
    """The best totals with one more child, and what it gives for each (the least of equal choices)."""
    totals: list[int | None] = [None] * width
    given = [0] * width
    for n in range(width):
        top = None
        for taken in range(min(n + 1, len(best))):
            before, value = merged[n - taken], best[taken]
            if before is None or value is None:
                continue
            if top is None or before + value > top:
                top, given[n] = before + value, taken
        totals[n] = top
    return totals, given


def _collect(table: _Table, count: int, tables: dict[int, _Table], chosen: list[str]) -> None:
    for child, given in reversed(table.splits):
        taken = given[count]
        count -= taken
        if not taken:
            continue
        if isinstance(child, str):
            chosen.append(child)
        else:
            _collect(tables[child], taken, tables, chosen)
