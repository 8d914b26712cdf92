"""GetPreferredAllocation's choice in-process (no gRPC): `preferred()` on the large node's replicas, and on
whole chips whose placement it searches (PCIe links and NUMA nodes), each call with the offer in another order."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Any

from bench.plugin import LARGE
from bench.settings import Settings
from bench.stats import latency_ms
from ix_device_plugin.core.inventory import (
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_INTERNAL,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    Inventory,
    link_key,
)
from ix_device_plugin.core.plan import Plan, plan
from ix_device_plugin.core.preferred import preferred
from ix_device_plugin.hardware.simulated import parse_spec
from ix_device_plugin.settings.config import Config

SIZE = 8
ORDERS = 16  # offer orders cycled through
NUMA_NODES = 2
BOARDS_PER_SWITCH = 2
BOARDS_PER_BRIDGE = 4


@dataclass(frozen=True)
class Case:
    """One node and request: the plan, and which of its devices are offered (the rest are in use)."""

    key: str
    build: Callable[[], Plan]
    offered: Callable[[list[str]], list[str]]


def _placed(boards: int, links: bool) -> Inventory:
    """BI-V150 boards, two per PCIe switch, four per host bridge, half on each NUMA node; links as IXML gives."""
    inventory = Inventory(boards=parse_spec(f"BI-V150:{boards}"))
    numa = [index * NUMA_NODES // boards for index in range(boards)]
    placed = tuple(
        replace(board, chips=tuple(replace(chip, numa_node=numa[index]) for chip in board.chips))
        for index, board in enumerate(inventory.boards)
    )
    inventory = replace(inventory, boards=placed)
    if not links:
        return inventory
    board_of = {chip.uuid: index for index, board in enumerate(placed) for chip in board.chips}

    def level(a: int, b: int) -> int:
        if a == b:
            return TOPOLOGY_INTERNAL
        if a // BOARDS_PER_SWITCH == b // BOARDS_PER_SWITCH:
            return TOPOLOGY_SINGLE
        if a // BOARDS_PER_BRIDGE == b // BOARDS_PER_BRIDGE:
            return TOPOLOGY_HOSTBRIDGE
        return TOPOLOGY_NODE if numa[a] == numa[b] else TOPOLOGY_SYSTEM

    pairs = combinations(board_of, 2)
    return replace(inventory, links={link_key(a, b): level(board_of[a], board_of[b]) for a, b in pairs})


def _all(ids: list[str]) -> list[str]:
    return ids


def _two_in_three(ids: list[str]) -> list[str]:
    return [device_id for index, device_id in enumerate(ids) if index % 3]


CASES = (
    Case(
        "replicas_2048",
        lambda: plan(Inventory(boards=parse_spec(LARGE.spec)), Config(splitboard=True, replicas=LARGE.replicas)),
        _all,
    ),
    Case("chips_32", lambda: plan(_placed(16, links=True), Config(splitboard=True)), _two_in_three),
    Case("chips_512", lambda: plan(_placed(256, links=False), Config(splitboard=True)), _two_in_three),
)


def measure(case: Case, runs: int) -> dict[str, Any]:
    """runs calls of preferred() for SIZE devices, the offer shuffled differently for each of ORDERS calls."""
    planned = case.build()
    offered = case.offered([device.id for device in planned.devices])
    shuffler = random.Random(0)
    orders = [shuffler.sample(offered, len(offered)) for _ in range(ORDERS)]
    preferred(planned, orders[0], [], SIZE)  # warm-up
    samples = []
    for run in range(runs):
        order = orders[run % ORDERS]
        started = time.perf_counter()
        preferred(planned, order, [], SIZE)
        samples.append(time.perf_counter() - started)
    return {"offered": len(offered), "size": SIZE, **latency_ms(samples)}


async def run(settings: Settings) -> dict[str, Any]:
    """The placement section: one summary per case."""
    return {case.key: measure(case, settings.placement_runs) for case in CASES}
