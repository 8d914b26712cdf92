"""Simulated devices, from a short spec (`BI-V150:2,BI-V100:1`) or a YAML file.

The YAML file is re-read at every health poll, so editing a chip's `health:`
or `present:` while the plugin runs changes what the kubelet is told.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ix_device_plugin.backends.base import BackendError
from ix_device_plugin.inventory import HEALTH_ERROR_NAMES, Board, Chip, ChipStatus, Inventory
from ix_device_plugin.products import PRODUCTS, Product, lookup

DEFAULT_SPEC = "BI-V150:2"
_UUID_NAMESPACE = uuidlib.UUID("6f1c1b0e-5d8e-4c1a-9a43-1e3e00000000")
_CHIP_KEYS = {"uuid", "minor", "bus_id", "numa_node", "memory_mib", "health", "present"}
_BOARD_KEYS = {"product", "chips"}


class SimulatedBackend:
    """A Backend over simulated boards; see the module docstring for the inputs."""

    name = "simulated"
    has_device_nodes = False

    def __init__(self, source: str = DEFAULT_SPEC) -> None:
        self.source = source
        self._path = _as_existing_file(source)

    def discover(self) -> Inventory:
        """Boards and chips as the spec or file describes them now."""
        if self._path is None:
            return Inventory(boards=parse_spec(self.source), driver_version="simulated")
        return Inventory(boards=load_file(self._path), driver_version="simulated")

    def health(self, inventory: Inventory) -> Mapping[str, ChipStatus]:
        """Chip statuses as the file says now; chips gone from the file are not present."""
        if self._path is None:
            return inventory.statuses()
        current = {chip.uuid: chip.status for board in load_file(self._path) for chip in board.chips}
        return {chip.uuid: current.get(chip.uuid, ChipStatus(present=False)) for chip in inventory.chips()}

    def close(self) -> None:
        """Nothing to release."""


def _as_existing_file(source: str) -> Path | None:
    path = Path(source)
    if path.suffix in {".yaml", ".yml", ".json"} or "/" in source:
        if not path.is_file():
            raise BackendError(f"simulated devices file {source} does not exist")
        return path
    return None


def parse_spec(spec: str) -> tuple[Board, ...]:
    """Boards for a spec like `BI-V150:2,BI-V100:1` (count defaults to 1)."""
    boards: list[Board] = []
    for position, item in enumerate(part.strip() for part in spec.split(",")):
        if not item:
            raise BackendError(f"simulated devices spec {spec!r}: empty item at position {position + 1}")
        name, _, count_text = item.partition(":")
        product = _product(name, where=f"simulated devices spec {spec!r}")
        count = _spec_count(count_text, item, spec)
        for _ in range(count):
            boards.append(_default_board(product.name, len(boards), _next_minor(boards)))
    return tuple(boards)


def _spec_count(text: str, item: str, spec: str) -> int:
    if not text:
        return 1
    if not text.isdigit() or int(text) < 1:
        raise BackendError(f"simulated devices spec {spec!r}: count in {item!r} must be a positive integer")
    return int(text)


def _product(name: str, where: str) -> Product:
    product = lookup(name)
    if product is None:
        known = ", ".join(PRODUCTS)
        raise BackendError(f"{where}: unknown product {name!r} (known: {known})")
    return product


def _next_minor(boards: list[Board]) -> int:
    return sum(len(board.chips) for board in boards)


def default_uuid(board_index: int, chip_index: int) -> str:
    """The deterministic UUID of chip chip_index on board board_index."""
    return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{board_index}/{chip_index}')}"


def _default_chip(product: str, board_index: int, chip_index: int, minor: int) -> Chip:
    facts = PRODUCTS[product]
    return Chip(
        uuid=default_uuid(board_index, chip_index),
        minor=minor,
        product=product,
        bus_id=f"0000:{0x10 + 2 * board_index + chip_index:02x}:00.0",
        numa_node=None,
        memory_mib=facts.memory_mib_per_chip,
    )


def _default_board(product: str, board_index: int, first_minor: int) -> Board:
    count = PRODUCTS[product].chips_per_board
    chips = tuple(_default_chip(product, board_index, i, first_minor + i) for i in range(count))
    return Board(product=product, chips=chips)


def load_file(path: Path) -> tuple[Board, ...]:
    """Boards described by the YAML (or JSON) file at path."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise BackendError(f"simulated devices file {path}: {error}") from error
    if not isinstance(document, dict) or not isinstance(document.get("boards"), list):
        raise BackendError(f"simulated devices file {path}: expected a mapping with a `boards:` list")
    boards: list[Board] = []
    for index, entry in enumerate(document["boards"]):
        boards.append(_board_from(entry, index, _next_minor(boards), f"{path}: boards[{index}]"))
    return tuple(boards)


def _board_from(entry: object, index: int, first_minor: int, where: str) -> Board:
    if not isinstance(entry, dict) or "product" not in entry:
        raise BackendError(f"{where}: expected a mapping with `product:`")
    _reject_unknown(entry, _BOARD_KEYS, where)
    product = _product(str(entry["product"]), where)
    defaults = _default_board(product.name, index, first_minor).chips
    chips_entry = entry.get("chips")
    if chips_entry is None:
        return Board(product=product.name, chips=defaults)
    if not isinstance(chips_entry, list) or not chips_entry:
        raise BackendError(f"{where}.chips: expected a non-empty list")
    chips = tuple(
        _chip_from(chip, _default_chip(product.name, index, i, first_minor + i), f"{where}.chips[{i}]")
        for i, chip in enumerate(chips_entry)
    )
    return Board(product=product.name, chips=chips)


def _reject_unknown(entry: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        raise BackendError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _chip_from(entry: object, default: Chip, where: str) -> Chip:
    if entry is None:
        return default
    if not isinstance(entry, dict):
        raise BackendError(f"{where}: expected a mapping")
    _reject_unknown(entry, _CHIP_KEYS, where)
    numa = _int(entry, "numa_node", -1 if default.numa_node is None else default.numa_node, where)
    return Chip(
        uuid=str(entry.get("uuid", default.uuid)),
        minor=_int(entry, "minor", default.minor or 0, where),
        product=default.product,
        bus_id=str(entry.get("bus_id", default.bus_id)),
        numa_node=None if numa < 0 else numa,
        memory_mib=_int(entry, "memory_mib", default.memory_mib, where),
        status=ChipStatus(errors=_health(entry, where), present=_bool(entry, "present", where)),
    )


def _int(entry: dict[str, Any], key: str, default: int, where: str) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BackendError(f"{where}.{key}: expected an integer, got {value!r}")
    return value


def _bool(entry: dict[str, Any], key: str, where: str) -> bool:
    value = entry.get(key, True)
    if not isinstance(value, bool):
        raise BackendError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _health(entry: dict[str, Any], where: str) -> frozenset[str]:
    value = entry.get("health") or []
    if not isinstance(value, list):
        raise BackendError(f"{where}.health: expected a list of error names, got {value!r}")
    unknown = [name for name in value if name not in HEALTH_ERROR_NAMES]
    if unknown:
        known = ", ".join(HEALTH_ERROR_NAMES)
        raise BackendError(f"{where}.health: unknown error {unknown[0]!r} (known: {known})")
    return frozenset(value)
