"""Device IDs per sharing setting, against the rules of Iluvatar's plugin 4.4.0, so that switching plugins on a
live node keeps the kubelet's checkpoint valid.

4.4.0's rules (pkg/gpuallocator/deviceset.go):
- `processSingleChip` (flags.splitboard true): every chip is a device named by its own UUID;
- `processMultiChip` (splitboard false): a chip at board position 0 is a device named by its UUID and takes the
  other chips of its board (`GetDeviceOnSameBoard`); a chip without a board position is a device of its own;
- `buildDevice`: with `Replicas == 0` the device is advertised once under that UUID; with any `Replicas > 0`
  (1 included) as `fmt.Sprintf("%s::%d", UUID, i)` for i in 0..Replicas-1.
4.4.0 lists devices in Go map order (unspecified), so the IDs are compared as sets; our own order is tested apart.
"""

from __future__ import annotations

import pytest

from ix_device_plugin.core.inventory import Board, Chip, Inventory
from ix_device_plugin.core.plan import plan
from ix_device_plugin.settings.config import Config

# Boards of one chip (BI-V100) and of two chips (BI-V150), chips listed in board position order.
ONE_CHIP = Board("BI-V100", (Chip("GPU-aaaaaaaa-0000-0000-0000-000000000001", 0, "BI-V100"),))
TWO_CHIPS = Board(
    "BI-V150",
    (
        Chip("GPU-bbbbbbbb-0000-0000-0000-000000000001", 1, "BI-V150"),  # board position 0
        Chip("GPU-bbbbbbbb-0000-0000-0000-000000000002", 2, "BI-V150"),  # board position 1
    ),
)
A = ONE_CHIP.chips[0].uuid
B0, B1 = (chip.uuid for chip in TWO_CHIPS.chips)

# (splitboard, replicas) -> the IDs 4.4.0 advertises for a node with ONE_CHIP and TWO_CHIPS.
EXPECTED: dict[tuple[bool, int], set[str]] = {
    (False, 0): {A, B0},
    (False, 1): {f"{A}::0", f"{B0}::0"},
    (False, 2): {f"{A}::0", f"{A}::1", f"{B0}::0", f"{B0}::1"},
    (False, 4): {f"{uuid}::{i}" for uuid in (A, B0) for i in range(4)},
    (True, 0): {A, B0, B1},
    (True, 1): {f"{A}::0", f"{B0}::0", f"{B1}::0"},
    (True, 2): {f"{uuid}::{i}" for uuid in (A, B0, B1) for i in range(2)},
    (True, 4): {f"{uuid}::{i}" for uuid in (A, B0, B1) for i in range(4)},
}


@pytest.mark.parametrize(("splitboard", "replicas"), sorted(EXPECTED))
def test_ids_are_those_of_iluvatars_plugin(splitboard: bool, replicas: int) -> None:
    result = plan(Inventory(boards=(ONE_CHIP, TWO_CHIPS)), Config(splitboard=splitboard, replicas=replicas))
    ids = [device.id for device in result.devices]
    assert len(ids) == len(set(ids))
    assert set(ids) == EXPECTED[splitboard, replicas]


@pytest.mark.parametrize("board", [ONE_CHIP, TWO_CHIPS], ids=["1 chip", "2 chips"])
@pytest.mark.parametrize("splitboard", [False, True])
@pytest.mark.parametrize("replicas", [0, 1, 2, 4])
def test_each_board_alone(board: Board, splitboard: bool, replicas: int) -> None:
    gpus = [chip.uuid for chip in board.chips] if splitboard else [board.chips[0].uuid]
    expected = set(gpus) if replicas == 0 else {f"{gpu}::{i}" for gpu in gpus for i in range(replicas)}
    result = plan(Inventory(boards=(board,)), Config(splitboard=splitboard, replicas=replicas))
    assert {device.id for device in result.devices} == expected


def test_one_replica_is_named_as_a_replica_and_holds_the_whole_gpu() -> None:
    result = plan(Inventory(boards=(TWO_CHIPS,)), Config(replicas=1))
    (device,) = result.devices
    assert (device.id, device.gpu, device.replica) == (f"{B0}::0", B0, 0)
    assert device.chips == TWO_CHIPS.chips
    assert not result.shared  # one replica per GPU: no GPU goes to two containers


def test_our_order_is_boards_then_replicas() -> None:
    result = plan(Inventory(boards=(ONE_CHIP, TWO_CHIPS)), Config(splitboard=True, replicas=2))
    assert [device.id for device in result.devices] == [
        f"{A}::0", f"{A}::1", f"{B0}::0", f"{B0}::1", f"{B1}::0", f"{B1}::1"
    ]  # fmt: skip
