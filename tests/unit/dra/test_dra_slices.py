"""Slice content for every node shape, checked against the API server's rules for ResourceSlices and pools."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from helpers.dra_validation import pool_errors, slice_errors

from ix_device_plugin.core.inventory import Board, Chip, ChipStatus, Inventory
from ix_device_plugin.dra.pool import pool_objects, quantity
from ix_device_plugin.dra.slices import (
    CHIPS_COUNTER,
    SlicePolicy,
    counter_set_body,
    slice_content,
    slice_devices,
)
from ix_device_plugin.hardware.simulated import parse_spec

WHOLE, SPLIT = SlicePolicy(splitboard=False), SlicePolicy(splitboard=True)


def inventory(spec: str) -> Inventory:
    return Inventory(boards=parse_spec(spec), driver_version="4.1.0", control_nodes=("/dev/itrctl",))


def published(inv: Inventory, policy: SlicePolicy = WHOLE) -> list[dict[str, Any]]:
    """The pool's slices for inv, as the publisher writes them once the API server keeps counters and taints."""
    content = slice_content(inv, policy=policy)
    devices = slice_devices(content, {}, taints=True)
    return pool_objects("node-a", devices, 3, "uid-1", [counter_set_body(c) for c in content.counter_sets])


def devices_of(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for obj in objects for d in obj["spec"].get("devices") or []}


def attribute(device: dict[str, Any], name: str) -> Any:
    return next(iter(device["attributes"][name].values()))


SHAPES = {  # every board has a counter set (its `chips`), single-chip ones too, unless shared
    "BI-V100": ("BI-V100:1", WHOLE, 1, 1, 2),
    "8 x BI-V100": ("BI-V100:8", WHOLE, 8, 8, 2),
    "BI-V150 whole": ("BI-V150:2", WHOLE, 6, 2, 2),
    "BI-V150 split": ("BI-V150:2", SPLIT, 6, 2, 2),
    "MR-V50": ("MR-V50:4", WHOLE, 4, 4, 2),
    "16 x BI-V150": ("BI-V150:16", WHOLE, 48, 16, 3),  # 48 devices in one slice, 16 counter sets in two
    "40 x BI-V150": ("BI-V150:40", SPLIT, 120, 40, 7),  # 64 + 56 devices, 5 slices of 8 counter sets
    "BI-V150 and BI-V100": ("BI-V150:1,BI-V100:2", WHOLE, 5, 3, 2),
    "BI-V150 whole, 4 replicas": ("BI-V150:2", SlicePolicy(False, 4), 2, 0, 1),
    "BI-V150 split, 4 replicas": ("BI-V150:2", SlicePolicy(True, 4), 4, 0, 1),
    "BI-V100, 8 replicas": ("BI-V100:2", SlicePolicy(False, 8), 2, 0, 1),
}


@pytest.mark.parametrize(("spec", "policy", "devices", "sets", "slices"), SHAPES.values(), ids=SHAPES.keys())
def test_every_node_shape_gives_a_pool_the_api_server_accepts(
    spec: str, policy: SlicePolicy, devices: int, sets: int, slices: int
) -> None:
    objects = published(inventory(spec), policy)
    assert pool_errors(objects) == []
    assert len(devices_of(objects)) == devices
    assert sum(len(obj["spec"].get("sharedCounters") or []) for obj in objects) == sets
    assert len(objects) == slices


def test_the_checks_refuse_what_the_api_server_refuses() -> None:
    objects = published(inventory("BI-V150:40"))
    crowded = {**objects[0], "spec": {**objects[0]["spec"], "devices": objects[0]["spec"]["devices"] * 2}}
    assert any("more than allowed" in error for error in slice_errors(crowded))
    both = {**objects[0], "spec": {**objects[0]["spec"], "sharedCounters": []}}
    assert any("only one of" in error for error in slice_errors(both))
    assert any("consumes board-0/gpu-0" in error for error in pool_errors(objects[:2]))  # counters not published
    shared = published(inventory("BI-V100:1"), SlicePolicy(False, 4))
    device = shared[0]["spec"]["devices"][0]
    del device["allowMultipleAllocations"]
    assert any("needs multiple" in error for error in slice_errors(shared[0]))


@pytest.mark.parametrize("policy", [WHOLE, SPLIT], ids=["whole", "split"])
def test_a_board_and_its_chips_draw_on_the_same_counters_so_never_both_go_out(policy: SlicePolicy) -> None:
    objects = published(inventory("BI-V150:2"), policy)
    devices = devices_of(objects)
    counters = {s["name"]: s["counters"] for obj in objects for s in obj["spec"].get("sharedCounters") or []}

    def fits(*names: str) -> bool:
        used: Counter[tuple[str, str]] = Counter()
        for name in names:
            for consumption in devices[name].get("consumesCounters") or []:
                for counter, value in consumption["counters"].items():
                    used[(consumption["counterSet"], counter)] += int(quantity(value["value"]) or 0)
        return all(quantity(counters[s][c]["value"]) >= n for (s, c), n in used.items())  # type: ignore[operator]

    assert fits("board-0") and fits("gpu-0", "gpu-1") and fits("board-0", "board-2") and fits("board-0", "gpu-2")
    assert not fits("board-0", "gpu-0") and not fits("board-0", "gpu-1") and not fits("board-2", "gpu-3")
    # the scheduler checks counters for admin access too: a monitoring claim can still take a chip in use
    assert fits("gpu-0", "gpu-0") and not fits("gpu-0", "gpu-0", "gpu-0")


@pytest.mark.parametrize("policy", [WHOLE, SPLIT], ids=["whole", "split"])
def test_every_device_consumes_its_chip_count_of_one_common_counter(policy: SlicePolicy) -> None:
    """One quota pool for chips and boards (Kueue's counter source `chips`): a chip 1, a board its chips, single-chip
    boards included, and the set never limits what the per-chip counters allow (room for admin access)."""
    objects = published(inventory("BI-V150:1,BI-V100:1"), policy)
    devices = devices_of(objects)
    sets = {s["name"]: s["counters"] for obj in objects for s in obj["spec"].get("sharedCounters") or []}
    charged = {
        name: [c["counters"][CHIPS_COUNTER]["value"] for c in device["consumesCounters"]]
        for name, device in devices.items()
    }
    assert charged == {"gpu-0": ["1"], "gpu-1": ["1"], "gpu-2": ["1"], "board-0": ["2"]}
    assert sets == {
        "board-0": {"gpu-0": {"value": "2"}, "gpu-1": {"value": "2"}, CHIPS_COUNTER: {"value": "4"}},
        "board-2": {CHIPS_COUNTER: {"value": "2"}},
    }
    assert devices["gpu-2"]["consumesCounters"][0]["counterSet"] == "board-2"


def test_shared_devices_consume_no_counters_and_say_they_are_shared() -> None:
    for policy in (SlicePolicy(True, 4), SlicePolicy(False, 4)):
        objects = published(inventory("BI-V150:1,BI-V100:1"), policy)
        devices = devices_of(objects)
        assert all("consumesCounters" not in d and attribute(d, "shared") for d in devices.values())
        assert not any(obj["spec"].get("sharedCounters") for obj in objects)
    unshared = devices_of(published(inventory("BI-V150:1"), WHOLE))
    assert not any(attribute(d, "shared") for d in unshared.values())


def test_the_type_attributes_tell_boards_from_chips_and_name_the_extended_resource_unit() -> None:
    whole = devices_of(published(inventory("BI-V150:1,BI-V100:1"), WHOLE))
    split = devices_of(published(inventory("BI-V150:1,BI-V100:1"), SPLIT))
    assert {name: attribute(d, "type") for name, d in whole.items()} == {
        "gpu-0": "chip", "gpu-1": "chip", "gpu-2": "chip", "board-0": "board"
    }  # fmt: skip
    # whole boards: the BI-V150 board and the BI-V100 (its one chip) are what one iluvatar.com/gpu is
    assert {n for n, d in whole.items() if attribute(d, "wholeBoard")} == {"board-0", "gpu-2"}
    assert {n for n, d in whole.items() if attribute(d, "extendedResource")} == {"board-0", "gpu-2"}
    assert {n for n, d in split.items() if attribute(d, "extendedResource")} == {"gpu-0", "gpu-1", "gpu-2"}
    board = whole["board-0"]
    assert board["capacity"]["memory"] == {"value": "65536Mi"}  # both chips' memory
    assert attribute(board, "boardUUID") == attribute(whole["gpu-1"], "boardUUID")
    assert "uuid" not in board["attributes"] and "minor" not in board["attributes"]


def test_shared_devices_have_shares_a_claim_draws_on_and_memory_it_need_not_ask_for() -> None:
    devices = devices_of(published(inventory("BI-V150:1"), SlicePolicy(True, 4)))
    chip = devices["gpu-0"]
    assert chip["allowMultipleAllocations"] is True and "consumesCounters" not in chip
    assert chip["capacity"]["shares"] == {
        "value": "4",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
    }
    assert chip["capacity"]["memory"]["requestPolicy"] == {"default": "0", "validRange": {"min": "0"}}
    boards = devices_of(published(inventory("BI-V150:1"), SlicePolicy(False, 4)))
    assert list(boards) == ["board-0"] and boards["board-0"]["capacity"]["shares"]["value"] == "4"


def test_the_product_name_is_the_model_on_hardware_as_in_simulation() -> None:
    chip = Chip("GPU-a", 0, "Iluvatar BI-V150S", bus_id="0000:8a:00.0", memory_mib=32768)
    (device,) = devices_of(published(Inventory(boards=(Board("Iluvatar BI-V150S", (chip,)),)))).values()
    assert attribute(device, "productName") == "BI-V150S"
    simulated = devices_of(published(inventory("BI-V150S:1")))
    assert attribute(simulated["gpu-0"], "productName") == "BI-V150S"


def test_a_sick_chip_makes_its_board_sick_and_a_missing_chip_too() -> None:
    base = inventory("BI-V150:1")
    chip = base.boards[0].chips[1]
    sick = base.with_statuses({chip.uuid: ChipStatus(xids=frozenset({79}))})
    devices = devices_of(published(sick))
    assert devices["board-0"]["taints"][0]["value"] == "gpu-1-XID-79"
    assert "taints" not in devices["gpu-0"]
    short = replace(base, boards=(replace(base.boards[0], chips=base.boards[0].chips[:1]),))
    content = slice_content(short)
    assert content.by_name()["board-0"].reasons == ("chip missing (1 of 2 chips of the BI-V150 enumerated)",)
    assert pool_errors(published(short)) == []


def test_without_counters_board_devices_that_need_them_are_left_out() -> None:
    content = slice_content(inventory("BI-V150:1,BI-V100:1"))
    names = [d["name"] for d in slice_devices(content, {}, taints=True, counters=False)]
    assert names == ["gpu-0", "gpu-1", "gpu-2"]
    assert all("consumesCounters" not in d for d in slice_devices(content, {}, taints=True, counters=False))
    unknown = slice_devices(content, {}, taints=True, counters=True, boards=False)
    assert [d["name"] for d in unknown] == ["gpu-0", "gpu-1", "gpu-2"] and "consumesCounters" in unknown[0]
    assert quantity("65536Mi") == Decimal(64 * 2**30)
