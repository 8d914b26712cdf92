"""Simulated devices, from a short spec (`BI-V150:2,BI-V100:1`) or a YAML file.

The YAML file is re-read at every health poll, so editing a chip's `health:`
or `present:` while the plugin runs changes what the kubelet is told. A file
found empty is read again once, REWRITE_PAUSE later: a file rewritten in place
is empty for a moment, which is no fault of the simulated chips. A chip's
`xids: [79]` are critical XID events: each is handed to watch_xids' sink once,
at the first discovery or poll that reads it. The driver version is what IXML
reports on a real node (`4.4.0`), or the file's `driver_version:`.
"""

from __future__ import annotations

import re
import threading
import time
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from ix_device_plugin.core.inventory import Board, Chip, ChipStatus, Inventory
from ix_device_plugin.core.products import PRODUCTS, Product, lookup
from ix_device_plugin.core.telemetry import ChipSample
from ix_device_plugin.hardware.backend import BackendError, XidEvent, XidSink
from ix_device_plugin.hardware.devnodes import device_access_problem
from ix_device_plugin.hardware.resetaccess import drivers_dir
from ix_device_plugin.hardware.resetpath import LocalReset, Resetter
from ix_device_plugin.settings import yamlsafe
from ix_device_plugin.settings.health import HEALTH_ERROR_NAMES
from ix_device_plugin.settings.table import DEFAULT_SIMULATED_DEVICES

try:  # the interpreter's own SHA-1: the stand-in for the GPU library loads no OpenSSL, which the real one does not
    from _sha1 import sha1
except ImportError:  # an interpreter built without it
    from hashlib import sha1

DEFAULT_SPEC = DEFAULT_SIMULATED_DEVICES
MAX_BOARDS = 256
MAX_MINOR = (1 << 20) - 1  # Linux minor numbers have 20 bits
# What IXML's nvmlSystemGetDriverVersion reports with Iluvatar's 4.4.0 software: X.Y.Z, as real nodes label it.
DEFAULT_DRIVER_VERSION = "4.4.0"
MAX_DRIVER_VERSION = 79  # IXML writes the version into an 80-byte buffer, its NUL included
_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_UUID_NAMESPACE = uuidlib.UUID("6f1c1b0e-5d8e-4c1a-9a43-1e3e00000000")
_CHIP_KEYS = {"uuid", "minor", "bus_id", "numa_node", "memory_mib", "health", "present", "xids"}
_BOARD_KEYS = {"product", "chips"}


class SimulatedBackend:
    """A Backend over simulated boards; see the module docstring for the inputs."""

    name = "simulated"

    def __init__(
        self,
        source: str = DEFAULT_SPEC,
        ixsmi_path: str | None = None,
        dev_root: str | Path = "/",
        resetter: Resetter | None = None,
    ) -> None:
        self.source = source
        self.dev_root = Path(dev_root)  # where the host's /dev is mounted: its GPU nodes must open, as for IXML
        self.ixsmi_path = ixsmi_path  # run for each reset, as the IXML backend runs ixsmi, when given
        # Who runs ixsmi -r: by default this process (a stand-in ixsmi when named, else the simulation itself), as
        # strict as the real one: it needs what ixsmi -r needs (CAP_SYS_ADMIN, a writable PCI driver directory).
        self.resetter: Resetter = resetter or LocalReset(ixsmi_path, drivers_dir(Path("/sys"), simulated=True))
        self._path = _as_existing_file(source)
        self.resets: list[tuple[str, ...]] = []  # every reset asked for, in order
        self._renamed: dict[str, str] = {}  # UUID in the file -> UUID after a reset that changed it
        self._xid_sink: XidSink | None = None
        self._xids_sent: set[tuple[str, int]] = set()
        self._vanished: set[str] = set()  # chips (their UUIDs in the file) that did not come back from a reset

    def discover(self) -> Inventory:
        """Boards and chips as the spec or file describes them now; BackendError, as the IXML backend raises it, when
        a GPU device node under dev_root may not be opened here (the container's device cgroup refuses it)."""
        problem = device_access_problem(self.dev_root)
        if problem is not None:
            raise BackendError(problem)
        boards = self._boards()  # first: a file that is no boards mapping is reported as such
        version = DEFAULT_DRIVER_VERSION if self._path is None else load_driver_version(self._path)
        return Inventory(boards=boards, driver_version=version)

    def health(self, inventory: Inventory) -> Mapping[str, ChipStatus]:
        """Chip statuses as the file says now; chips gone from the file are not present."""
        if self._path is None:
            return inventory.statuses()
        current = {chip.uuid: chip.status for board in self._boards() for chip in board.chips}
        return {chip.uuid: current.get(chip.uuid, ChipStatus(present=False)) for chip in inventory.chips()}

    def reset(self, uuids: Sequence[str], timeout: float, abort: threading.Event | None = None) -> None:
        """A reset as the file's `reset:` mapping says (RESET_BEHAVIOURS): chips listed under `fail` fail it, under
        `new_uuid` come back with another UUID, under `lie` are not reset though ixsmi exits 0 (their XIDs are
        reported again), under `vanish` do not come back; all others reset fine. The resetter runs first, as the
        IXML backend runs ixsmi (a failure fails the reset; without the privilege ixsmi -r needs, it refuses)."""
        self.resets.append(tuple(uuids))
        self.resetter.run(uuids, timeout, abort)
        behaviour = reset_behaviour(self._path) if self._path is not None else {}
        original = {new: old for old, new in self._renamed.items()}
        failing = [uuid for uuid in uuids if behaviour.get(original.get(uuid, uuid)) == "fail"]
        if failing:
            raise BackendError(f"simulated ixsmi -r -i {','.join(uuids)}: {', '.join(failing)} did not reset")
        for uuid in uuids:
            kind = behaviour.get(original.get(uuid, uuid))
            if kind == "new_uuid":
                self._renamed[original.get(uuid, uuid)] = f"{original.get(uuid, uuid)}-reset{len(self.resets)}"
            elif kind == "lie":  # ixsmi said it reset the chip, which was not reset: its XIDs are still pending
                self._xids_sent = {(chip, xid) for chip, xid in self._xids_sent if chip != uuid}
            elif kind == "vanish":  # the chip does not come back from the reset
                self._vanished.add(original.get(uuid, uuid))

    def reset_problem(self) -> str | None:
        """Why no reset can work here (the resetter's answer); None when one can."""
        return self.resetter.problem()

    def xids_watched(self) -> frozenset[str] | None:
        """Every chip the file lists, once an XID sink is set (the simulation's events are never lost)."""
        if self._xid_sink is None:
            return frozenset()
        return frozenset(chip.uuid for board in self._boards() for chip in board.chips if chip.status.present)

    def _boards(self) -> tuple[Board, ...]:
        boards = parse_spec(self.source) if self._path is None else self._sending_xids(load_file(self._path))
        if self._vanished:  # as IXML lists them: a board whose every chip vanished is not there either
            kept = (
                replace(board, chips=tuple(chip for chip in board.chips if chip.uuid not in self._vanished))
                for board in boards
            )
            boards = tuple(board for board in kept if board.chips)
        if not self._renamed:
            return boards
        return tuple(
            replace(
                board, chips=tuple(replace(chip, uuid=self._renamed.get(chip.uuid, chip.uuid)) for chip in board.chips)
            )
            for board in boards
        )

    def sample(self, inventory: Inventory) -> dict[str, ChipSample]:
        """Plausible, deterministic figures for every present chip (they vary with the chip's minor)."""
        samples = {}
        for chip in inventory.chips():
            if not chip.status.present:
                continue
            seed = chip.minor or 0
            used = float(1024 * (seed % 8))
            samples[chip.uuid] = ChipSample(
                temperature_c=40.0 + seed,
                fan_speed=30.0 + seed,
                power_w=60.0 + 5 * seed,
                sm_clock_mhz=1500.0,
                mem_clock_mhz=1600.0,
                gpu_utilization=float(10 * (seed % 10)),
                mem_utilization=float(5 * (seed % 20)),
                mem_total_mib=float(chip.memory_mib),
                mem_used_mib=used,
                mem_free_mib=float(chip.memory_mib) - used,
                pcie_tx_kbps=1000.0 * seed,
                pcie_rx_kbps=2000.0 * seed,
                ecc_sbe_volatile=0.0,
                ecc_dbe_volatile=float("ECC" in chip.status.errors),
            )
        return samples

    def watch_xids(self, sink: XidSink) -> None:
        """Hand each chip's `xids:` from the file to sink, once each."""
        self._xid_sink = sink

    def _sending_xids(self, boards: tuple[Board, ...]) -> tuple[Board, ...]:
        """boards without their xids, each new one handed to the sink (the daemon keeps them, not the file)."""
        for chip in (chip for board in boards for chip in board.chips):
            for xid in sorted(chip.status.xids):
                if self._xid_sink is not None and (chip.uuid, xid) not in self._xids_sent:
                    self._xids_sent.add((chip.uuid, xid))
                    self._xid_sink(XidEvent(uuid=chip.uuid, xid=xid))
        return tuple(
            replace(board, chips=tuple(replace(c, status=replace(c.status, xids=frozenset())) for c in board.chips))
            for board in boards
        )

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
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_BOARDS:
        raise BackendError(
            f"simulated devices spec {spec!r}: count in {item!r} must be a whole number from 1 to {MAX_BOARDS}"
        )
    return int(text)


def _product(name: str, where: str) -> Product:
    product = lookup(name)
    if product is None:
        import difflib  # only to name the product meant

        known = ", ".join(PRODUCTS)
        close = difflib.get_close_matches(name.upper(), list(PRODUCTS), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise BackendError(f"{where}: unknown product {name!r}{hint} (known: {known})")
    return product


def _next_minor(boards: list[Board]) -> int:
    return sum(len(board.chips) for board in boards)


def default_uuid(board_index: int, chip_index: int) -> str:
    """The deterministic UUID of chip chip_index on board board_index: uuid5's (uuid.uuid5 would load OpenSSL's
    hashes, 0.6 MiB of the process's memory)."""
    digest = sha1(_UUID_NAMESPACE.bytes + f"{board_index}/{chip_index}".encode()).digest()
    return f"GPU-{uuidlib.UUID(bytes=digest[:16], version=5)}"


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


# What a reset does to a chip the file's `reset:` lists: fail (ixsmi fails), new_uuid (it comes back under another
# UUID), lie (ixsmi exits 0 but the chip was not reset: its XIDs are reported again), vanish (it does not come back).
RESET_BEHAVIOURS = ("fail", "new_uuid", "lie", "vanish")
REWRITE_PAUSE = 0.05  # seconds before an empty devices file is read again


def reset_behaviour(path: Path) -> dict[str, str]:
    """UUID -> one of RESET_BEHAVIOURS, from the file's optional `reset:` mapping; BackendError when malformed."""
    document = _read_document(path)
    section = document.get("reset") if isinstance(document, dict) else None
    if section is None:
        return {}
    if not isinstance(section, dict) or not set(section) <= set(RESET_BEHAVIOURS):
        raise BackendError(
            f"simulated devices file {path}: reset: expected a mapping with lists of chip UUIDs under "
            f"{', '.join(RESET_BEHAVIOURS)}"
        )
    behaviour: dict[str, str] = {}
    for kind, uuids in section.items():
        if not isinstance(uuids, list) or not all(isinstance(uuid, str) for uuid in uuids):
            raise BackendError(f"simulated devices file {path}: reset.{kind}: expected a list of chip UUIDs")
        behaviour.update(dict.fromkeys(uuids, kind))
    return behaviour


def load_driver_version(path: Path) -> str:
    """The file's `driver_version:` (DEFAULT_DRIVER_VERSION when absent); BackendError when it is not one.

    Any text IXML could report is taken as it is ("" for a library that reports none), so that what the front
    ends make of an odd version (no labels, no driverVersion attribute) can be tried too.
    """
    document = _read_document(path)
    value = document.get("driver_version", DEFAULT_DRIVER_VERSION) if isinstance(document, dict) else ""
    if not isinstance(value, str):
        raise BackendError(
            f'simulated devices file {path}: driver_version: expected a quoted string such as "4.1.0-rc1", '
            f"got {yamlsafe.shown(value)}"
        )
    if len(value) > MAX_DRIVER_VERSION or not value.isascii() or not value.isprintable():
        raise BackendError(
            f"simulated devices file {path}: driver_version: expected at most {MAX_DRIVER_VERSION} printable "
            f"ASCII characters, as IXML reports it, got {yamlsafe.shown(value)}"
        )
    return value


def load_file(path: Path) -> tuple[Board, ...]:
    """Boards described by the YAML (or JSON) file at path; raises BackendError naming the file and field."""
    document = _read_document(path)
    if not isinstance(document, dict) or not isinstance(document.get("boards"), list):
        raise BackendError(f"simulated devices file {path}: expected a mapping with a `boards:` list")
    if len(document["boards"]) > MAX_BOARDS:
        raise BackendError(f"simulated devices file {path}: more than {MAX_BOARDS} boards")
    boards: list[Board] = []
    for index, entry in enumerate(document["boards"]):
        boards.append(_board_from(entry, index, _next_minor(boards), f"{path}: boards[{index}]"))
    _check_unique(boards, path)
    return tuple(boards)


def _read_document(path: Path) -> Any:
    """The file's YAML as plain data, read as strictly as a config file (size, depth, tags, encoding)."""
    try:
        data = _read_bytes(path)
        if not data.strip():  # rewritten in place (`>`, an editor, Path.write_text): empty until written
            time.sleep(REWRITE_PAUSE)
            data = _read_bytes(path)
        text = yamlsafe.decode(data)
        yamlsafe.compose(text)  # refuses anchors, custom tags, deep nesting and huge numbers first
        return yaml.safe_load(text)
    except OSError as error:
        raise BackendError(f"simulated devices file {path}: cannot read it: {error.strerror or error}") from None
    except yamlsafe.YamlError as error:
        raise BackendError(f"simulated devices file {path}: {error}") from None
    except yaml.YAMLError as error:
        raise BackendError(f"simulated devices file {path}: {yamlsafe.describe(error)}") from None


def _read_bytes(path: Path) -> bytes:
    with path.open("rb") as stream:
        return stream.read(yamlsafe.MAX_BYTES + 1)


def _check_unique(boards: list[Board], path: Path) -> None:
    """UUIDs and minors identify chips: each must be unique on the node."""
    uuids: dict[str, str] = {}
    minors: dict[int, str] = {}
    for board_index, board in enumerate(boards):
        for chip_index, chip in enumerate(board.chips):
            where = f"boards[{board_index}].chips[{chip_index}]"
            if chip.uuid in uuids:
                raise BackendError(f"{path}: {where}.uuid: {chip.uuid} is also {uuids[chip.uuid]}'s")
            uuids[chip.uuid] = where
            if chip.minor is not None and chip.minor in minors:
                raise BackendError(f"{path}: {where}.minor: {chip.minor} is also {minors[chip.minor]}'s")
            if chip.minor is not None:
                minors[chip.minor] = where


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
    unknown = sorted(str(key) for key in set(entry) - known)
    if unknown:
        raise BackendError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _chip_from(entry: object, default: Chip, where: str) -> Chip:
    if entry is None:
        return default
    if not isinstance(entry, dict):
        raise BackendError(f"{where}: expected a mapping")
    _reject_unknown(entry, _CHIP_KEYS, where)
    numa = _int(entry, "numa_node", -1 if default.numa_node is None else default.numa_node, where, low=-1)
    return Chip(
        uuid=_uuid(entry.get("uuid", default.uuid), where),
        minor=_int(entry, "minor", default.minor or 0, where, high=MAX_MINOR),
        product=default.product,
        bus_id=str(entry.get("bus_id", default.bus_id)),
        numa_node=None if numa < 0 else numa,
        memory_mib=_int(entry, "memory_mib", default.memory_mib, where),
        status=ChipStatus(
            errors=_health(entry, where), present=_bool(entry, "present", where), xids=_xids(entry, where)
        ),
    )


def _int(entry: dict[str, Any], key: str, default: int, where: str, low: int = 0, high: int = 1 << 40) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BackendError(f"{where}.{key}: expected a whole number, got {yamlsafe.shown(value)}")
    if not low <= value <= high:
        raise BackendError(f"{where}.{key}: expected a whole number from {low} to {high}, got {value}")
    return value


def _uuid(value: object, where: str) -> str:
    if not isinstance(value, str) or not _UUID.match(value):
        raise BackendError(
            f"{where}.uuid: expected 1-63 letters, digits, '-', '_' or '.' (no ',' or '::', which separate device "
            f"IDs), got {yamlsafe.shown(value)}"
        )
    return value


def _bool(entry: dict[str, Any], key: str, where: str) -> bool:
    value = entry.get(key, True)
    if not isinstance(value, bool):
        raise BackendError(f"{where}.{key}: expected true or false, got {yamlsafe.shown(value)}")
    return value


def _xids(entry: dict[str, Any], where: str) -> frozenset[int]:
    value = entry.get("xids") or []
    if not isinstance(value, list) or not all(
        isinstance(xid, int) and not isinstance(xid, bool) and 0 < xid < 1 << 32 for xid in value
    ):
        raise BackendError(f"{where}.xids: expected a list of XID numbers, got {yamlsafe.shown(value)}")
    return frozenset(value)


def _health(entry: dict[str, Any], where: str) -> frozenset[str]:
    value = entry.get("health") or []
    if not isinstance(value, list):
        raise BackendError(f"{where}.health: expected a list of error names, got {yamlsafe.shown(value)}")
    unknown = [name for name in value if name not in HEALTH_ERROR_NAMES]
    if unknown:
        known = ", ".join(HEALTH_ERROR_NAMES)
        raise BackendError(f"{where}.health: unknown error {yamlsafe.shown(unknown[0])} (known: {known})")
    return frozenset(value)
