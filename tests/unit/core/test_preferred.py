"""GetPreferredAllocation placement: same board, then PCIe switch, host bridge and NUMA node, whatever the
order the kubelet offers the devices in; checked against every candidate set on small nodes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from ix_device_plugin.core.inventory import (
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_MULTIPLE,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    Board,
    Chip,
    Inventory,
    link_key,
)
from ix_device_plugin.core.placement import placement
from ix_device_plugin.core.plan import Plan, plan
from ix_device_plugin.core.preferred import preferred
from ix_device_plugin.settings.config import Config


@dataclass(frozen=True)
class Slot:
    """Where a board sits: its chip count, PCIe switch, host bridge and NUMA node (each numbered node-wide)."""

    chips: int
    switch: int
    bridge: int
    numa: int


def _level(a: tuple[Slot, int], b: tuple[Slot, int]) -> int:
    """The PCIe common-ancestor level IXML reports between two chips (slot, board index)."""
    (slot_a, board_a), (slot_b, board_b) = a, b
    if board_a == board_b:
        return TOPOLOGY_INTERNAL
    if slot_a.switch == slot_b.switch:
        return TOPOLOGY_SINGLE
    if slot_a.bridge == slot_b.bridge:
        return TOPOLOGY_HOSTBRIDGE
    return TOPOLOGY_NODE if slot_a.numa == slot_b.numa else TOPOLOGY_SYSTEM


def node(slots: list[Slot], *, links: bool = True, numa: bool = True) -> Inventory:
    """Boards b0, b1, ... with chips GPU-<board>-<chip>; links and NUMA nodes as the library reports them."""
    boards = []
    where: dict[str, tuple[Slot, int]] = {}
    for index, slot in enumerate(slots):
        chips = []
        for position in range(slot.chips):
            uuid = f"GPU-{index}-{position}"
            where[uuid] = (slot, index)
            chips.append(
                Chip(uuid=uuid, minor=len(where) - 1, product="BI-V150", numa_node=slot.numa if numa else None)
            )
        boards.append(Board("BI-V150", tuple(chips), expected_chips=slot.chips))
    pairs = {link_key(a, b): _level(where[a], where[b]) for a, b in combinations(where, 2)} if links else {}
    return Inventory(boards=tuple(boards), links=pairs)


def split(inventory: Inventory) -> Plan:
    return plan(inventory, Config(splitboard=True))


def score(p: Plan, ids: list[str]) -> tuple[int, ...]:
    return placement(p.topology, [p.by_id[device_id].gpu for device_id in ids])


def boards_of(ids: list[str]) -> set[str]:
    return {device_id.rsplit("-", 1)[0] for device_id in ids}


# ---- the placement score ---------------------------------------------------------------------

TWO_BRIDGES = [Slot(2, 0, 0, 0), Slot(2, 0, 0, 0), Slot(2, 1, 0, 0), Slot(2, 2, 1, 0), Slot(2, 3, 2, 1)]


def test_the_score_orders_board_switch_bridge_numa_node_cpus_then_nothing_known() -> None:
    p = split(node(TWO_BRIDGES))
    board = ["GPU-0-0", "GPU-0-1"]
    switch = ["GPU-0-0", "GPU-1-0"]
    bridge = ["GPU-0-0", "GPU-2-0"]
    numa = ["GPU-0-0", "GPU-3-0"]
    cpus = ["GPU-0-0", "GPU-4-0"]
    assert score(p, board) < score(p, switch) < score(p, bridge) < score(p, numa) < score(p, cpus)
    unknown = split(node(TWO_BRIDGES, links=False, numa=False))
    assert score(unknown, board) < score(unknown, switch) == score(unknown, cpus)
    assert score(split(node(TWO_BRIDGES, links=False)), cpus) < score(unknown, cpus)


def test_the_score_keeps_as_few_pairs_apart_as_it_can_farthest_level_first() -> None:
    p = split(node(TWO_BRIDGES))
    two_boards = ["GPU-0-0", "GPU-0-1", "GPU-1-0", "GPU-1-1"]
    four_chips = ["GPU-0-0", "GPU-1-0", "GPU-2-0", "GPU-2-1"]
    assert score(p, two_boards) < score(p, four_chips)
    # Three chips on one NUMA node beat a whole board with a chip across the CPUs.
    assert score(p, ["GPU-0-0", "GPU-2-0", "GPU-3-0"]) < score(p, ["GPU-0-0", "GPU-0-1", "GPU-4-0"])


# ---- named cases that split boards or bridges before --------------------------------------------

THREE_BOARDS = [Slot(2, 0, 0, 0), Slot(2, 0, 0, 0), Slot(2, 0, 0, 0)]


def test_split_boards_partly_used_two_chips_come_from_one_board_whatever_the_offer_order() -> None:
    for links in (True, False):  # the library reports same-board links, or only which chips share a board
        p = split(node(THREE_BOARDS, links=links))
        # GPU-0-0 is in use; the kubelet offers the rest starting with its board's other chip.
        offered = ["GPU-0-1", "GPU-1-0", "GPU-2-1", "GPU-1-1", "GPU-2-0"]
        assert preferred(p, offered, [], 2) == ["GPU-1-0", "GPU-1-1"]
        assert preferred(p, offered[::-1], [], 2) == ["GPU-1-0", "GPU-1-1"]


def test_without_a_free_board_two_chips_stay_under_one_host_bridge() -> None:
    p = split(node([Slot(2, 0, 0, 0), Slot(2, 1, 1, 0), Slot(2, 2, 1, 0)]))
    offered = ["GPU-0-1", "GPU-1-1", "GPU-2-1"]  # each board's chip 0 is in use
    assert preferred(p, offered, [], 2) == ["GPU-1-1", "GPU-2-1"]


def test_one_chip_comes_from_a_board_already_half_used() -> None:
    p = split(node(THREE_BOARDS))
    offered = ["GPU-0-0", "GPU-0-1", "GPU-1-0", "GPU-2-1", "GPU-2-0"]  # GPU-1-1 is in use
    assert preferred(p, offered, [], 1) == ["GPU-1-0"]


def test_must_include_chip_gets_its_closest_free_neighbours() -> None:
    p = split(node(TWO_BRIDGES))
    offered = ["GPU-3-0", "GPU-4-1", "GPU-0-1", "GPU-1-0", "GPU-1-1", "GPU-2-0", "GPU-2-1", "GPU-4-0"]
    assert preferred(p, offered, ["GPU-0-1"], 3) == ["GPU-0-1", "GPU-1-0", "GPU-1-1"]
    assert preferred(p, offered, ["GPU-4-1"], 2) == ["GPU-4-1", "GPU-4-0"]


def test_whole_boards_stay_on_one_numa_node_and_take_the_one_that_fits_tightest() -> None:
    slots = [Slot(2, 0, 0, 0), Slot(2, 1, 1, 1), Slot(2, 2, 2, 0), Slot(2, 3, 3, 1), Slot(2, 4, 4, 1)]
    p = plan(node(slots), Config())
    boards = [b.uuid for b in node(slots).boards]
    assert set(preferred(p, boards[::-1], [], 2)) == {boards[0], boards[2]}
    assert set(preferred(p, boards, [], 3)) == {boards[1], boards[3], boards[4]}


def test_replicas_spread_over_the_first_gpus_board_first() -> None:
    p = plan(node(THREE_BOARDS, links=False), Config(splitboard=True, replicas=2))
    offered = [d.id for d in p.devices if not d.id.startswith("GPU-1-1")]
    offered.sort(key=lambda device_id: not device_id.startswith("GPU-2-1"))  # the kubelet's order
    chosen = preferred(p, offered, [], 2)
    assert [p.by_id[i].gpu for i in chosen] == ["GPU-2-1", "GPU-2-0"]


# ---- properties over random partly used nodes ------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A GetPreferredAllocation request on a node, with a second order of the same offer."""

    inventory: Inventory
    plan: Plan
    offered: list[str]
    must: list[str]
    size: int
    reordered: list[str]


@st.composite
def requests(draw: st.DrawFn, most: int = 10, any_links: bool = True) -> Request:
    """A node of up to 5 boards of 1 or 2 chips, partly used (at most `most` devices offered); a request on it.

    Links as a PCIe tree gives them, none, or (any_links) any level for any pair of chips.
    """
    numas = draw(st.integers(1, 2))
    bridges = [draw(st.integers(0, numas - 1)) for _ in range(draw(st.integers(1, 3)))]  # bridge -> NUMA node
    switches = [draw(st.integers(0, len(bridges) - 1)) for _ in range(draw(st.integers(1, 4)))]  # -> bridge
    slots = []
    for _ in range(draw(st.integers(1, 5))):
        switch = draw(st.integers(0, len(switches) - 1))
        slots.append(Slot(draw(st.integers(1, 2)), switch, switches[switch], bridges[switches[switch]]))
    inventory = node(slots, links=draw(st.booleans()), numa=draw(st.booleans()))
    if any_links and draw(
        st.booleans()
    ):  # levels that no PCIe tree gives: the groups still nest, the search still exact
        levels = st.sampled_from([0, 10, 20, 30, 40, 50, 60, -1])
        chips = [chip.uuid for chip in inventory.chips()]
        inventory = replace(inventory, links={link_key(a, b): draw(levels) for a, b in combinations(chips, 2)})
    p = plan(inventory, Config(splitboard=draw(st.booleans())))
    ids = [device.id for device in p.devices]
    available = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=most, unique=True))
    must = draw(st.lists(st.sampled_from(available), unique=True))
    size = draw(st.integers(max(1, len(must)), len(available)))
    return Request(inventory, p, draw(st.permutations(available)), must, size, draw(st.permutations(available)))


def candidates(available: list[str], must: list[str], size: int) -> list[list[str]]:
    others = [device_id for device_id in available if device_id not in must]
    return [[*must, *rest] for rest in combinations(others, size - len(must))]


@settings(max_examples=400, deadline=None)
@given(requests())
def test_the_answer_is_placed_as_well_as_the_best_candidate_set(request: Request) -> None:
    p, offered, must, size = request.plan, request.offered, request.must, request.size
    chosen = preferred(p, offered, must, size)
    assert len(chosen) == size == len(set(chosen))
    assert set(must) <= set(chosen) <= set(offered)
    assert score(p, chosen) == min(score(p, candidate) for candidate in candidates(offered, must, size))


@settings(max_examples=300, deadline=None)
@given(requests())
def test_of_sets_placed_equally_well_the_answer_leaves_the_rest_best_placed(request: Request) -> None:
    p, offered, must, size = request.plan, request.offered, request.must, request.size
    chosen = preferred(p, offered, must, size)

    def rank(ids: list[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return score(p, ids), score(p, [device_id for device_id in offered if device_id not in ids])

    assert rank(chosen) == min(rank(candidate) for candidate in candidates(offered, must, size))


@settings(max_examples=300, deadline=None)
@given(requests())
def test_the_answer_does_not_depend_on_the_offer_order(request: Request) -> None:
    p, must, size = request.plan, request.must, request.size
    first = preferred(p, request.offered, must, size)
    again = preferred(p, request.reordered, must, size)
    assert score(p, again) == score(p, first)
    assert sorted(again) == sorted(first)


# ---- against Iluvatar's 4.4.0 best-effort policy (pkg/gpuallocator/besteffort_policy.go) --------

# Its points for a pair of devices by the IXML link level between their first chips; unknown: 0.
ILUVATAR_PAIR_POINTS = {
    TOPOLOGY_INTERNAL: 60,
    TOPOLOGY_SINGLE: 50,
    TOPOLOGY_MULTIPLE: 40,
    TOPOLOGY_HOSTBRIDGE: 30,
    TOPOLOGY_NODE: 20,
    TOPOLOGY_SYSTEM: 10,
}


def iluvatar_set_points(request: Request, ids: list[str | None]) -> int:
    """4.4.0's score of a set: the sum of its pairs' points (padding scores nothing)."""
    chip = {device.id: device.chips[0].uuid for device in request.plan.devices}
    points = 0
    for a, b in combinations(ids, 2):
        if a is not None and b is not None:
            points += ILUVATAR_PAIR_POINTS.get(request.inventory.links.get(link_key(chip[a], chip[b]), -1), 0)
    return points


def iluvatar_best_effort(request: Request) -> list[str] | None:
    """4.4.0's answer, step for step: the best scoring partition of the offer (padded with None to a multiple
    of size) into sets of size, among those with a padding-free set holding every required device; then its
    best set holding them. None where 4.4.0 would hand back padding."""
    offered, required, size = request.offered, request.must, request.size
    if size == 1:
        partitions: list[list[list[str | None]]] = [[[device]] for device in offered]
    else:
        padded: list[str | None] = [*offered, *[None] * (-len(offered) % size)]
        padding = padded.count(None)
        partitions = []

        def iterate(devices: list[str | None], accum: list[list[str | None]]) -> None:
            if len(devices) == size:
                partitions.append([*accum, devices])
                return
            for rest in combinations(devices[1:], size - 1):
                chosen = [devices[0], *rest]
                if chosen.count(None) not in (0, padding):
                    continue
                has_padding = None in chosen  # Go's gpuSetContains: every nil matches a nil in the set
                remaining = [d for d in devices if d not in chosen and not (d is None and has_padding)]
                iterate(remaining, [*accum, chosen])

        iterate(padded, [])

    def holds_required(candidate: list[str | None]) -> bool:
        return all(device in candidate for device in required)

    best_partition, best_points = None, 0
    for partition in partitions:
        if not any(holds_required(s) and None not in s for s in partition):
            continue
        points = sum(iluvatar_set_points(request, s) for s in partition)
        if points > best_points or best_partition is None:
            best_partition, best_points = partition, points
    assert best_partition is not None
    sets = [s for s in best_partition if holds_required(s)]
    best = sets[0]
    for candidate in sets[1:]:
        if iluvatar_set_points(request, candidate) > iluvatar_set_points(request, best):
            best = candidate
    return None if None in best else [device for device in best if device is not None]


def _half_used_split_boards() -> Request:
    inventory = node(THREE_BOARDS)
    offered = ["GPU-0-1", "GPU-1-0", "GPU-2-1", "GPU-1-1", "GPU-2-0"]
    return Request(inventory, split(inventory), offered, [], 2, offered)


@settings(max_examples=200, deadline=None)
@given(requests(most=8, any_links=False))  # 4.4.0 reads a board's links from its first chip only
@example(_half_used_split_boards())
def test_never_placed_worse_than_iluvatars_best_effort_policy(request: Request) -> None:
    theirs = iluvatar_best_effort(request)
    assume(theirs is not None)
    assert theirs is not None
    ours = preferred(request.plan, request.offered, request.must, request.size)
    assert score(request.plan, ours) <= score(request.plan, theirs)
    if request.size == 2:  # one pair: our order and 4.4.0's points agree
        assert iluvatar_set_points(request, list(ours)) >= iluvatar_set_points(request, list(theirs))
