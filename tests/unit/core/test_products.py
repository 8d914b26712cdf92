"""Facts about Iluvatar's products: the table, the names as IXML gives them, and the chips a board should have."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core.inventory import Board, Chip
from ix_device_plugin.core.products import PRODUCTS, VENDOR, expected_chips, full_name, lookup, model


def test_the_model_is_the_name_without_its_vendor() -> None:
    assert model("Iluvatar BI-V150S") == "BI-V150S"
    assert model("ILUVATAR  MR-V50 ") == "MR-V50"
    assert model("BI-V100") == "BI-V100"
    assert model("Iluvatar") == "Iluvatar", "a vendor alone is a name, not a prefix"


def test_the_full_name_has_the_vendor_once() -> None:
    assert full_name("BI-V150") == full_name("Iluvatar BI-V150") == "Iluvatar BI-V150"
    assert full_name("") == VENDOR


@pytest.mark.parametrize("name", ["BI-V150", "bi-v150", "Iluvatar BI-V150", " ILUVATAR BI-V150 "])
def test_a_product_is_found_by_any_spelling_of_its_name(name: str) -> None:
    assert lookup(name) is PRODUCTS["BI-V150"]


def test_an_unknown_product_is_none() -> None:
    assert lookup("BI-V999") is None


def test_only_the_bi_v150_carries_two_chips() -> None:
    assert {name for name, product in PRODUCTS.items() if product.chips_per_board > 1} == {"BI-V150"}


def board(product: str, chips: int, *, known: bool = True, expected: int | None = None) -> Board:
    members = tuple(Chip(f"GPU-{i}", i, product) for i in range(chips))
    return Board(product, members, membership_known=known, expected_chips=expected)


def test_a_board_of_a_known_product_should_have_its_chips() -> None:
    assert expected_chips(board("Iluvatar BI-V150", 1)) == 2


def test_a_board_of_an_unknown_product_should_have_what_its_first_discovery_saw() -> None:
    assert expected_chips(board("BI-V999", 1, expected=3)) == 3
    assert expected_chips(board("BI-V999", 2)) == 2


def test_a_board_of_unknown_membership_is_the_chips_it_has() -> None:
    assert expected_chips(board("BI-V150", 1, known=False)) == 1


@given(st.text(max_size=80))
def test_any_name_the_library_gives_has_a_model_and_a_full_name(name: str) -> None:
    stripped = model(name)
    assert stripped == stripped.strip()
    assert model(stripped) == stripped or stripped.lower().startswith(VENDOR.lower() + " ")
    assert full_name(name).startswith(VENDOR)
    assert lookup(name) is None or lookup(name) is lookup(stripped)
