"""Iluvatar products the plugin knows: chips per board and nominal memory per chip.

Chip counts: the seed README of Iluvatar's plugin ("BI-V150, which has 2 GPU
chips on it"); every other product listed there is a single-chip card.
Memory: the vendors' product sheets (BI-V100 and MR-V100: 32 GiB; MR-V50:
16 GiB; BI-V150: 64 GiB, 32 GiB per chip; BI-V150S: 32 GiB, as ixsmi prints
in the seed README). Memory is informational (shown by `list`); it never
changes what is advertised. A simulated device file can override both.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    key = name.strip().upper().removeprefix("ILUVATAR ").strip()
    for product in PRODUCTS.values():
        if product.name.upper() == key:
            return product
    return None
