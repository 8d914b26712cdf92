"""Which containers hold which chip, from the kubelet's device IDs and claim devices (core/telemetry.py)."""

from __future__ import annotations

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.plan import plan
from ix_device_plugin.core.telemetry import (
    ClaimDevice,
    Holder,
    Holdings,
    PodRef,
    chip_pods,
    claim_holders,
    plugin_holders,
)
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


# ---- a DRA node: every container holding a chip, through claims (pod-resources dynamic_resources) ----------

DRIVER, POOL = "gpu.iluvatar.com", "node-a"


def _claim_device(pod: PodRef, claim: str, device: str, **fields: str) -> ClaimDevice:
    values = {"claim_namespace": pod.namespace, "claim_name": claim, "driver": DRIVER, "pool": POOL, "device": device}
    return ClaimDevice(pod, **{**values, **fields})


def test_claims_give_a_boards_chips_and_every_holder_of_a_chip() -> None:
    inventory = Inventory(boards=parse_spec("BI-V150:2"))
    a0, a1, b0, b1 = (chip.uuid for chip in inventory.chips())
    devices = {"board-0": (a0, a1), "gpu-0": (a0,), "gpu-1": (a1,), "gpu-2": (b0,), "gpu-3": (b1,)}
    trainer, infer, watch = PodRef("ml", "trainer", "main"), PodRef("ml", "infer", "main"), PodRef("mon", "w", "probe")
    holdings = Holdings(
        claims=(
            _claim_device(trainer, "train", "board-0"),
            _claim_device(infer, "infer", "gpu-2"),
            _claim_device(watch, "watch", "gpu-2"),
            _claim_device(watch, "watch", "gpu-2"),  # listed twice: one holder
            _claim_device(infer, "nic", "gpu-3", driver="nic.example.com"),
            _claim_device(infer, "elsewhere", "gpu-3", pool="node-b"),
            _claim_device(infer, "gone", "gpu-9"),
        )
    )
    holders = claim_holders(holdings, DRIVER, POOL, devices, plan(inventory, Config()))
    assert holders == {
        a0: (Holder(trainer, "ml", "train"),),
        a1: (Holder(trainer, "ml", "train"),),
        b0: (Holder(infer, "ml", "infer"), Holder(watch, "mon", "watch")),
    }


def test_shares_are_a_holder_each_and_plugin_devices_still_count() -> None:
    inventory = Inventory(boards=parse_spec("BI-V150:2"))
    a0, a1, b0, b1 = (chip.uuid for chip in inventory.chips())
    one, two, legacy = PodRef("t", "one", "c"), PodRef("t", "two", "c"), PodRef("old", "legacy", "main")
    holdings = Holdings(
        devices=((("iluvatar.com/gpu", inventory.boards[1].uuid, legacy)), ("other.com/x", "y", legacy)),
        claims=(_claim_device(one, "s1", "gpu-0", share_id="s-1"), _claim_device(two, "s2", "gpu-0", share_id="s-2")),
    )
    holders = claim_holders(holdings, DRIVER, POOL, {"gpu-0": (a0,)}, plan(inventory, Config()))
    assert holders[a0] == (Holder(one, "t", "s1", "s-1"), Holder(two, "t", "s2", "s-2"))
    assert holders[b0] == holders[b1] == (Holder(legacy),)  # a whole board, as the plugin planned it
    assert a1 not in holders


def test_the_device_plugins_holders_are_one_per_chip_as_before() -> None:
    inventory = Inventory(boards=parse_spec("BI-V100:2"))
    shared = plan(inventory, Config(replicas=2))
    first, second = PodRef("ns", "a", "main"), PodRef("ns", "b", "main")
    gpu_a, _ = (board.uuid for board in inventory.boards)
    holders = plugin_holders(shared, {f"{gpu_a}::0": first, f"{gpu_a}::1": second})
    assert holders == {gpu_a: (Holder(first),)}
