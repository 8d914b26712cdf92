"""A board that loses a chip from enumeration keeps it, not present, until it is back (carry_missing)."""

from __future__ import annotations

from ix_device_plugin.core.inventory import MISSING_CHIP, Board, Chip, Inventory, carry_missing
from ix_device_plugin.core.labels import labels
from ix_device_plugin.core.limits import list_message_size
from ix_device_plugin.core.plan import plan
from ix_device_plugin.deviceplugin.service import list_response
from ix_device_plugin.settings.config import Config


def chip(uuid: str, minor: int) -> Chip:
    return Chip(uuid=uuid, minor=minor, product="BI-V150")


BOTH = Inventory(boards=(Board("BI-V150", (chip("GPU-a", 0), chip("GPU-b", 1))),))


def test_a_vanished_chip_keeps_its_board_unhealthy_with_its_uuid() -> None:
    first = carry_missing(Inventory(), BOTH)
    second = carry_missing(first, Inventory(boards=(Board("BI-V150", (chip("GPU-a", 0),)),)))
    (board,) = second.boards
    assert [c.uuid for c in board.chips] == ["GPU-a", "GPU-b"]
    assert not board.chips[1].status.present and MISSING_CHIP in board.chips[1].status.problems
    (device,) = plan(second, Config()).devices
    assert device.id == "GPU-a" and not device.healthy
    assert any("GPU-b: chip missing from enumeration" in reason for reason in device.reasons)


def test_the_board_keeps_its_id_when_its_first_chip_vanishes() -> None:
    first = carry_missing(Inventory(), BOTH)
    second = carry_missing(first, Inventory(boards=(Board("BI-V150", (chip("GPU-b", 1),)),)))
    assert [device.id for device in plan(second, Config()).devices] == ["GPU-a"]
    split = plan(second, Config(splitboard=True))
    assert [(d.id, d.healthy) for d in split.devices] == [("GPU-a", False), ("GPU-b", True)]


def test_the_chip_coming_back_heals_the_board_and_a_board_fully_gone_is_forgotten() -> None:
    first = carry_missing(Inventory(), BOTH)
    short = carry_missing(first, Inventory(boards=(Board("BI-V150", (chip("GPU-a", 0),)),)))
    back = carry_missing(short, BOTH)
    assert plan(back, Config()).devices[0].healthy
    assert carry_missing(back, Inventory()).boards == ()


def test_a_board_short_from_the_start_is_unhealthy_by_the_product_table() -> None:
    short = carry_missing(Inventory(), Inventory(boards=(Board("BI-V150", (chip("GPU-a", 0),)),)))
    (device,) = plan(short, Config()).devices
    assert device.reasons == ("chip missing (1 of 2 chips of the BI-V150 enumerated)",)


def test_an_unknown_product_learns_its_chip_count_from_the_first_discovery() -> None:
    three = Inventory(boards=(Board("X-1", (Chip("GPU-x", 0, "X-1"), Chip("GPU-y", 1, "X-1"))),))
    first = carry_missing(Inventory(), three)
    assert first.boards[0].expected_chips == 2
    assert plan(first, Config()).devices[0].healthy


def alone(*chips: Chip) -> Inventory:
    """Chips whose board the library did not report (a driver without board positions)."""
    return Inventory(boards=tuple(Board("BI-V150", (c,), membership_known=False) for c in chips))


def test_a_chip_without_a_board_position_is_a_healthy_board_of_its_own() -> None:
    inventory = carry_missing(Inventory(), alone(chip("GPU-a", 0), chip("GPU-b", 1), chip("GPU-c", 2)))
    result = plan(inventory, Config())
    assert [(device.id, device.healthy) for device in result.devices] == [
        ("GPU-a", True),
        ("GPU-b", True),
        ("GPU-c", True),
    ]
    assert list_message_size(inventory, Config()) == list_response(result).ByteSize()
    node = labels(inventory, result, Config(), None, None)
    assert node["iluvatar.com/gpu.healthy"] == "3" and node["iluvatar.com/gpu.boards"] == "3"


def test_a_board_whose_membership_is_unknown_carries_no_vanished_chip_and_teaches_no_count() -> None:
    first = carry_missing(Inventory(), BOTH)
    unknown = carry_missing(first, alone(chip("GPU-a", 0)))
    assert [c.uuid for c in unknown.chips()] == ["GPU-a"] and plan(unknown, Config()).devices[0].healthy
    x1 = Chip("GPU-x", 0, "X-1")
    learnt = carry_missing(Inventory(), Inventory(boards=(Board("X-1", (x1,), membership_known=False),)))
    both = Inventory(boards=(Board("X-1", (x1, Chip("GPU-y", 1, "X-1"))),))
    assert carry_missing(learnt, both).boards[0].expected_chips == 2


def test_a_placed_chip_without_its_partner_is_still_short() -> None:
    placed = Board("BI-V150", (chip("GPU-a", 0),))
    inventory = carry_missing(Inventory(), Inventory(boards=(placed, *alone(chip("GPU-b", 1)).boards)))
    assert [(device.id, device.healthy) for device in plan(inventory, Config()).devices] == [
        ("GPU-a", False),
        ("GPU-b", True),
    ]
