"""How well a set of GPUs is placed, and the best placed set of a given size among the free ones.

The placement score of a set: for each level from the farthest in (across CPUs, NUMA node, host bridge,
PCIe switches, PCIe switch, board), how many pairs of its GPUs do not share a group at that level. Lower is
better, compared level by level from the farthest: a set that fits in one board beats one that fits under
one PCIe switch, which beats one that fits on one NUMA node; a set too large for one group keeps as few
pairs apart as it can at the farthest level first (two whole boards under one bridge beat four chips from
four boards under it).

The search is exact for this score. For a set of fixed size, pairs apart at a level are all pairs less the
pairs together in each group of that level, and a group's pairs together depend only on how many of its GPUs
are taken. So the best n GPUs of a group are the best split of n over its children (its own GPUs, its
smaller groups) plus the group's own pairs: a knapsack over each group's children, bottom-up, at most the
request size wide. Of children alike (same table of best scores), no more than the request size can give
any GPU, so the rest are left out of the knapsack.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass
from math import comb

from ix_device_plugin.core.topology import LEVELS, NODE, Group, Topology

Best = tuple[int | None, ...]  # the best score for each number of GPUs taken; None: not possible
Child = int | tuple[str, ...]  # a smaller group (its index), or the group's own free GPUs, must-take first


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
    """A group's best score for each number of its free GPUs taken, and how each splits over its children:
    per child, in the order merged, the number it gives for each total so far."""

    best: Best
    free: int
    splits: tuple[tuple[Child, tuple[int, ...]], ...]


def best_placed(topology: Topology, free: Set[str], must: Set[str], size: int) -> list[str]:
    """size GPUs of free, every GPU of must among them, with the best placement score; of sets placed
    equally well, the one that leaves the rest of free best placed (by the same score), then one fixed
    by the topology alone.

    Needs 1 <= size <= len(free), len(must) <= size and must within free.
    """
    return _Search(topology, free, must, size).run()


class _Search:
    """One search. A score is one integer whose order is the score's: every level's count of pairs is below
    `base`, so the pairs taken together at each level (farthest first) are its most significant digits,
    then the pairs left together (farthest first)."""

    def __init__(self, topology: Topology, free: Set[str], must: Set[str], size: int) -> None:
        self._topology, self._free, self._must, self._size = topology, free, must, size
        base = len(topology.paths) ** 2 + 1
        self._taken = [base ** (LEVELS + level) for level in range(LEVELS)]
        self._left = [base**level for level in range(LEVELS)]
        # Groups alike (same levels, free count and children's tables) merge alike: each is merged once.
        self._merged: dict[tuple[object, ...], tuple[Best, tuple[tuple[int, ...], ...]]] = {}

    def run(self) -> list[str]:
        """The GPUs chosen."""
        tables: dict[int, _Table] = {}
        for index, group in enumerate(self._topology.groups):
            table = self._table(group, tables)
            if table is not None:
                tables[index] = table
        root = tables.get(len(self._topology.groups) - 1)
        if root is None or self._size >= len(root.best) or root.best[self._size] is None:
            raise ValueError(f"no {self._size} of the {len(self._free)} free GPUs hold the {len(self._must)} to take")
        chosen: list[str] = []
        _collect(root, self._size, tables, chosen)
        return chosen

    def _table(self, group: Group, tables: dict[int, _Table]) -> _Table | None:
        """The group's table; None when none of its GPUs is free."""
        own = [gpu for gpu in group.gpus if gpu in self._free]
        needed = sum(1 for gpu in own if gpu in self._must) if self._must else 0
        if needed:
            own.sort(key=lambda gpu: gpu not in self._must)
        if not group.groups:  # most groups (boards): their table hangs on two counts only
            if not own:
                return None
            key: tuple[object, ...] = (group.levels, len(own), needed)
            if key not in self._merged:
                self._merged[key] = self._merge_all((self._own_best(len(own), needed),), group.levels, len(own))
            best, (given,) = self._merged[key]
            return _Table(best, len(own), ((tuple(own), given),))
        children: list[tuple[Child, Best]] = [(tuple(own), self._own_best(len(own), needed))] if own else []
        free = len(own) + self._add_groups(group, tables, children)
        if not children:
            return None
        bests = tuple(best for _, best in children)
        key = (group.levels, free, bests)
        if key not in self._merged:
            self._merged[key] = self._merge_all(bests, group.levels, free)
        best, givens = self._merged[key]
        return _Table(best, free, tuple(zip((child for child, _ in children), givens, strict=True)))

    def _own_best(self, free: int, needed: int) -> Best:
        """The table of a group's own free GPUs: any number from those it must take, none scored."""
        return (None,) * needed + (0,) * (min(self._size, free) - needed + 1)

    def _add_groups(self, group: Group, tables: dict[int, _Table], children: list[tuple[Child, Best]]) -> int:
        """Add the group's smaller groups that have free GPUs to children; their free GPUs.

        Of groups alike (same table) that may give none, at most `size` can give any: the rest are left out.
        """
        free = 0
        alike: dict[Best, int] = {}
        for child in group.groups:
            table = tables.get(child)
            if table is None:
                continue
            free += table.free
            if table.best[0] is not None:
                alike[table.best] = alike.get(table.best, 0) + 1
                if alike[table.best] > self._size:
                    continue
            children.append((child, table.best))
        return free

    def _merge_all(
        self, bests: tuple[Best, ...], levels: tuple[int, ...], free: int
    ) -> tuple[Best, tuple[tuple[int, ...], ...]]:
        """The best split of each total over children with these tables, plus the group's own pairs."""
        limit = min(self._size, free)
        merged: list[int | None] = [0]
        givens = []
        for best in bests:
            merged, given = _merge(merged, best, min(limit, len(merged) + len(best) - 2))
            givens.append(given)
        taken = sum(self._taken[level] for level in levels)
        left = sum(self._left[level] for level in levels)
        scored = tuple(
            None if value is None else value + comb(n, 2) * taken + comb(free - n, 2) * left
            for n, value in enumerate(merged)
        )
        return scored, tuple(givens)


def _merge(merged: list[int | None], best: Best, reach: int) -> tuple[list[int | None], tuple[int, ...]]:
    """The best totals up to reach with one more child, and what it gives for each (the least of equals)."""
    if len(merged) == 1:  # the first child
        return list(best[: reach + 1]), tuple(range(reach + 1))
    totals: list[int | None] = []
    given: list[int] = []
    for n in range(reach + 1):
        top, choice = None, 0
        for taken in range(max(0, n - len(merged) + 1), min(n, len(best) - 1) + 1):
            before, value = merged[n - taken], best[taken]
            if before is not None and value is not None and (top is None or before + value > top):
                top, choice = before + value, taken
        totals.append(top)
        given.append(choice)
    return totals, tuple(given)


def _collect(table: _Table, count: int, tables: dict[int, _Table], chosen: list[str]) -> None:
    for child, given in reversed(table.splits):
        taken = given[count]
        count -= taken
        if not taken:
            continue
        if isinstance(child, tuple):
            chosen.extend(child[:taken])
        else:
            _collect(tables[child], taken, tables, chosen)
