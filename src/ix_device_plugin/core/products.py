"""Facts about Iluvatar's products: their names, chips per board and nominal memory per chip.

Every module that needs a product fact asks here. Chip counts: the seed README of Iluvatar's plugin ("BI-V150,
which has 2 GPU chips on it"); every other product listed there is a single-chip card. Memory: the vendors'
product sheets (BI-V100 and MR-V100: 32 GiB; MR-V50: 16 GiB; BI-V150: 64 GiB, 32 GiB per chip; BI-V150S: 32 GiB,
as ixsmi prints in the seed README). Memory is informational (shown by `list`); it never changes what is
advertised. A simulated device file can override both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ix_device_plugin.core.inventory import Board

VENDOR = "Iluvatar"
UNKNOWN = "unknown"  # the product of a chip whose name the library did not give
# The product name as IXML gives it starts with the vendor ("Iluvatar BI-V150S"); labels and slices have the model.
_VENDOR_PREFIX = VENDOR.lower() + " "


@dataclass(frozen=True)
class Product:
    """Facts about one board model."""

    name: str
    chips_per_board: int
    memory_mib_per_chip: int


PRODUCTS: dict[str, Product] = {
    product.name: product
    for product in (
        Product("BI-V150", 2, 32768),
        Product("BI-V150S", 1, 32768),
        Product("BI-V100", 1, 32768),
        Product("MR-V100", 1, 32768),
        Product("MR-V50", 1, 16384),
    )
}


def lookup(name: str) -> Product | None:
    """The product called name (case-insensitive, with or without an `Iluvatar ` prefix)."""
    key = model(name).upper()
    for product in PRODUCTS.values():
        if product.name.upper() == key:
            return product
    return None


def model(name: str) -> str:
    """The model part of a product name as IXML gives it: `Iluvatar BI-V150S` gives `BI-V150S`."""
    stripped = name.strip()
    if stripped.lower().startswith(_VENDOR_PREFIX):
        return stripped[len(_VENDOR_PREFIX) :].strip()
    return stripped


def full_name(name: str) -> str:
    """The product's name with its vendor, as Iluvatar's tools show it: `BI-V150` and `Iluvatar BI-V150` both give
    `Iluvatar BI-V150`; an empty name gives the vendor alone."""
    return f"{VENDOR} {model(name)}".strip()


def expected_chips(board: Board) -> int:
    """How many chips the board should have: the product table's count, else what its first discovery saw.

    A board whose membership the library did not report is the chips it has.
    """
    if not board.membership_known:
        return len(board.chips)
    product = lookup(board.product)
    if product is not None:
        return product.chips_per_board
    return board.expected_chips or len(board.chips)
