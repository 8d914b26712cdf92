"""The planning rules: capacity, IDs, health and topology of advertised devices."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ix_device_plugin.core.inventory import Board, Chip, ChipStatus, Inventory, link_key
from ix_device_plugin.core.plan import MAX_DEVICE_ID_LENGTH, plan
from ix_device_plugin.hardware.simulated import parse_spec
from ix_device_plugin.settings.config import Config


def inventory(spec: str) -> Inventory:
    return Inventory(boards=parse_spec(spec))


@pytest.mark.parametrize(
    ("spec", "splitboard", "replicas", "capacity"),
    [
        ("BI-V150:2", False, 0, 2),
        ("BI-V150:2", True, 0, 4),
        ("BI-V150:2", False, 4, 8),
        ("BI-V150:2", True, 4, 16),
        ("BI-V100:2", False, 4, 8),
        ("BI-V100:2", True, 4, 8),
        ("BI-V150:1", False, 1, 1),
        ("BI-V150:1,BI-V100:1,MR-V100:1", True, 0, 4),
        ("MR-V50:3", False, 2, 6),
        ("BI-V150S:1", True, 0, 1),
        ("BI-V150:16", True, 64, 2048),
    ],
)
def test_capacity_table(spec: str, splitboard: bool, replicas: int, capacity: int) -> None:
    result = plan(inventory(spec), Config(splitboard=splitboard, replicas=replicas))
    assert result.capacity() == capacity
    assert len(result.by_id) == capacity  # IDs are unique


def test_board_device_is_its_first_chip_and_carries_both_chips() -> None:
    inv = inventory("BI-V150:1")
    (device,) = plan(inv, Config()).devices
    first, second = inv.boards[0].chips
    assert device.id == first.uuid
    assert [chip.uuid for chip in device.chips] == [first.uuid, second.uuid]


def test_replica_ids_are_uuid_double_colon_index() -> None:
    inv = inventory("BI-V100:1")
    uuid = inv.boards[0].uuid
    ids = [d.id for d in plan(inv, Config(replicas=3)).devices]
    assert ids == [f"{uuid}::0", f"{uuid}::1", f"{uuid}::2"]


def _with_chip_status(inv: Inventory, board: int, chip: int, status: ChipStatus) -> Inventory:
    target = inv.boards[board].chips[chip].uuid
    return inv.with_statuses({target: status})


def test_board_with_one_unhealthy_chip_is_one_unhealthy_device() -> None:
    inv = _with_chip_status(inventory("BI-V150:2"), 0, 1, ChipStatus(errors=frozenset({"ECC"})))
    devices = plan(inv, Config()).devices
    assert [d.healthy for d in devices] == [False, True]
    assert devices[0].reasons == (f"{inv.boards[0].chips[1].uuid}: ECC",)


def test_split_board_with_one_unhealthy_chip_is_one_of_two() -> None:
    inv = _with_chip_status(inventory("BI-V150:1"), 0, 1, ChipStatus(errors=frozenset({"OverTemp"})))
    devices = plan(inv, Config(splitboard=True)).devices
    assert [d.healthy for d in devices] == [True, False]


def test_missing_chip_makes_its_board_unhealthy() -> None:
    inv = _with_chip_status(inventory("BI-V150:1"), 0, 1, ChipStatus(present=False))
    (device,) = plan(inv, Config()).devices
    assert not device.healthy
    assert "not present" in device.reasons[0]


def test_replicas_share_the_health_of_their_gpu() -> None:
    inv = _with_chip_status(inventory("BI-V150:2"), 1, 0, ChipStatus(errors=frozenset({"PCIE"})))
    devices = plan(inv, Config(replicas=4)).devices
    assert [d.healthy for d in devices] == [True] * 4 + [False] * 4


def test_ignored_health_errors() -> None:
    inv = _with_chip_status(inventory("BI-V100:1"), 0, 0, ChipStatus(errors=frozenset({"OverTemp", "ECC"})))
    assert not plan(inv, Config(ignored_health_errors=frozenset({"OverTemp"}))).devices[0].healthy
    assert plan(inv, Config(ignored_health_errors=frozenset({"OverTemp", "ECC"}))).devices[0].healthy
    assert plan(inv, Config(ignored_health_errors=frozenset({"all"}))).devices[0].healthy
    gone = _with_chip_status(inv, 0, 0, ChipStatus(present=False))
    assert not plan(gone, Config(ignored_health_errors=frozenset({"all"}))).devices[0].healthy


def test_numa_nodes_of_a_board_are_its_chips_nodes() -> None:
    chips = (
        Chip(uuid="GPU-a", minor=0, product="BI-V150", numa_node=1),
        Chip(uuid="GPU-b", minor=1, product="BI-V150", numa_node=1),
    )
    inv = Inventory(boards=(Board("BI-V150", chips), Board("BI-V100", (Chip("GPU-c", 2, "BI-V100"),))))
    devices = plan(inv, Config()).devices
    assert devices[0].numa_nodes == (1,)
    assert devices[1].numa_nodes == ()


def test_renamed_resource_when_shared() -> None:
    inv = inventory("BI-V100:1")
    assert plan(inv, Config(replicas=2, rename_by_default=True)).resource_name == "iluvatar.com/gpu.shared"
    assert plan(inv, Config(replicas=1, rename_by_default=True)).resource_name == "iluvatar.com/gpu"
    assert plan(inv, Config(resource_name="example.com/ix")).resource_name == "example.com/ix"


def test_overlong_ids_are_left_out_with_a_warning() -> None:
    long_uuid = "GPU-" + "x" * 56  # 60 characters: 63 with ::9, 64 with ::10
    inv = Inventory(boards=(Board("BI-V100", (Chip(long_uuid, 0, "BI-V100"),)),))
    result = plan(inv, Config(replicas=11))
    assert all(len(d.id) <= MAX_DEVICE_ID_LENGTH for d in result.devices)
    assert result.capacity() == 10
    assert "::10" in result.warnings[0]


def test_gpu_links_take_the_closest_chip_pair() -> None:
    inv = inventory("BI-V150:2")
    a0, a1 = (c.uuid for c in inv.boards[0].chips)
    b0, b1 = (c.uuid for c in inv.boards[1].chips)
    links = {link_key(a0, b0): 40, link_key(a1, b1): 20, link_key(a0, a1): 0}
    inv = Inventory(boards=inv.boards, links=links)
    board_plan = plan(inv, Config())
    assert board_plan.gpu_link(a0, b0) == 20
    split_plan = plan(inv, Config(splitboard=True))
    assert split_plan.gpu_link(a0, b0) == 40
    assert split_plan.gpu_link(a0, b1) is None


_PLAN_DUMP = """
import json, sys
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.settings.config import Config
from ix_device_plugin.core.plan import plan
from ix_device_plugin.deviceplugin.service import list_response
for splitboard in (False, True):
    p = plan(SimulatedBackend("BI-V150:2,BI-V100:3,MR-V100:1").discover(), Config(replicas=3, splitboard=splitboard))
    print(list_response(p).SerializeToString().hex())
    print(json.dumps(sorted(p.gpu_links.items())))
"""


def test_plan_is_deterministic() -> None:
    """The same inputs give the same plan in processes with different hash seeds (set and dict order)."""
    outputs = set()
    for seed in ("1", "2", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run([sys.executable, "-c", _PLAN_DUMP], capture_output=True, text=True, env=env, check=True)
        outputs.add(result.stdout)
    assert len(outputs) == 1
