"""Which container holds which chip, from the kubelet's device IDs (core/telemetry.py)."""

from __future__ import annotations

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.plan import plan
from ix_device_plugin.core.telemetry import PodRef, chip_pods
from ix_device_plugin.hardware.simulated import parse_spec
from ix_device_plugin.settings.config import Config


def test_a_whole_board_gives_each_of_its_chips_to_the_container() -> None:
    inventory = Inventory(boards=parse_spec("BI-V150:1"))
    board_plan = plan(inventory, Config())
    (board,) = board_plan.devices
    holder = PodRef("ns", "p", "c")
    pods = chip_pods(board_plan, {board.id: holder, "not-a-device": PodRef("x", "y", "z")})
    assert pods == {chip.uuid: holder for chip in inventory.chips()}


def test_a_replica_names_its_chip_and_the_first_holder_keeps_it() -> None:
    inventory = Inventory(boards=parse_spec("BI-V100:2"))
    shared = plan(inventory, Config(replicas=2))
    first, second = PodRef("ns", "a", "main"), PodRef("ns", "b", "main")
    gpu_a, gpu_b = (board.uuid for board in inventory.boards)
    pods = chip_pods(shared, {f"{gpu_a}::0": first, f"{gpu_a}::1": second, f"{gpu_b}::1": second})
    assert pods == {gpu_a: first, gpu_b: second}
