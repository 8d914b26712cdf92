"""What IXML says about each device: identity, product, PCI place, memory, board position and health."""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ix_device_plugin.core.inventory import Chip, ChipStatus, health_errors_from_mask
from ix_device_plugin.core.products import UNKNOWN
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.ixml.library import HANDLE, NVML_SUCCESS, CallError, Library, Memory, PciInfo

log = logging.getLogger(__name__)

_T = TypeVar("_T")

PLACEHOLDER_UUID_PREFIX = "IX-UNKNOWN-"

_UUID_BUFFER_SIZE = 80
_NAME_BUFFER_SIZE = 64
MIB = 1024 * 1024
_BUS_ID = re.compile(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)$")


def normalize_bus_id(bus_id: str) -> str:
    """A PCI bus id in sysfs form (`0000:8a:00.0`) from NVML's (`00000000:8A:00.0`); '' if unparsable."""
    match = _BUS_ID.match(bus_id.strip())
    if match is None:
        return ""
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def read_numa_node(sysfs_root: str | Path, bus_id: str) -> int | None:
    """The NUMA node sysfs gives for a PCI device (sysfs bus id form), None when unknown."""
    if not bus_id:
        return None
    try:
        node = int((Path(sysfs_root) / "bus/pci/devices" / bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def placeholder_uuid(index: int, bus_id: str) -> str:
    """A stable stand-in identity for a device whose UUID cannot be read."""
    suffix = f"-{bus_id.replace(':', '-')}" if bus_id else ""
    return f"{PLACEHOLDER_UUID_PREFIX}{index}{suffix}"


def unidentified_at(by_bus: Mapping[str, Chip], bus_id: str) -> Chip | None:
    """The chip now at bus_id when its UUID can no longer be read."""
    chip = by_bus.get(bus_id) if bus_id else None
    return chip if chip is not None and chip.uuid.startswith(PLACEHOLDER_UUID_PREFIX) else None


@dataclass(frozen=True)
class Device:
    """What one enumeration learnt about one device."""

    index: int
    handle: int | None
    chip: Chip
    # Position on its board; None when the library cannot say.
    position: int | None = None


class DeviceReader:
    """Enumerates the library's devices; says once that health checks are unavailable."""

    def __init__(self, sysfs_root: Path) -> None:
        self._sysfs_root = sysfs_root
        self._health_unavailable_logged = False

    def enumerate(self, library: Library) -> list[Device]:
        """Every device the library counts, in its order; BackendError when it cannot count them."""
        return [self._read_device(library, index) for index in range(_count(library))]

    def handles(self, library: Library) -> list[Device]:
        """The handle, UUID and board position of every device that has a handle, for a telemetry pass: no
        health, memory or sysfs reads (the health poll has them). BackendError when the library cannot count."""
        devices = (_handle_only(library, index) for index in range(_count(library)))
        return [device for device in devices if device is not None]

    def _read_device(self, library: Library, index: int) -> Device:
        handle = HANDLE()
        try:
            library.call("handle", index, ctypes.byref(handle))
        except CallError as exc:
            chip = Chip(
                uuid=placeholder_uuid(index, ""),
                minor=None,
                product=UNKNOWN,
                status=ChipStatus(problems=(str(exc),)),
            )
            return Device(index=index, handle=None, chip=chip)
        problems: list[str] = []
        uuid = _attempt(problems, lambda: _uuid(library, handle))
        product = _attempt(problems, lambda: library.string("name", handle, size=_NAME_BUFFER_SIZE))
        minor = _attempt(problems, lambda: library.uint("minor", handle))
        bus_id = _attempt(problems, lambda: _bus_id(library, handle)) or ""
        memory = _attempt(problems, lambda: _memory_mib(library, handle))
        position = _optional(problems, library, "board_position", lambda: library.uint("board_position", handle))
        chip = Chip(
            uuid=uuid or placeholder_uuid(index, bus_id),
            minor=minor,
            product=product or UNKNOWN,
            bus_id=bus_id,
            numa_node=read_numa_node(self._sysfs_root, bus_id),
            memory_mib=memory or 0,
            status=ChipStatus(errors=self._health_errors(library, handle, problems), problems=tuple(problems)),
        )
        return Device(index=index, handle=handle.value, chip=chip, position=position)

    def _health_errors(self, library: Library, handle: HANDLE, problems: list[str]) -> frozenset[str]:
        if not library.has("health"):
            self._note_health_unavailable(library)
            return frozenset()
        mask = ctypes.c_ulonglong()
        try:
            library.call("health", handle, ctypes.byref(mask))
        except CallError as exc:
            if exc.not_supported:
                self._note_health_unavailable(library)
            else:
                problems.append(str(exc))
            return frozenset()
        return health_errors_from_mask(mask.value)

    def _note_health_unavailable(self, library: Library) -> None:
        if not self._health_unavailable_logged:
            self._health_unavailable_logged = True
            log.warning(
                "IXML health checks are unavailable (%s lacks or does not support ixmlDeviceGetHealth): "
                "chips count as healthy while their calls and device nodes work",
                library.path,
            )


def _count(library: Library) -> int:
    count = ctypes.c_uint()
    try:
        library.call("count", ctypes.byref(count))
    except CallError as exc:
        raise BackendError(f"IXML library {library.path} cannot count devices: {exc}") from exc
    return count.value


def _handle_only(library: Library, index: int) -> Device | None:
    handle = HANDLE()
    try:
        library.call("handle", index, ctypes.byref(handle))
    except CallError:
        return None
    problems: list[str] = []
    uuid = _attempt(problems, lambda: _uuid(library, handle))
    if uuid is None:  # named as discovery names it
        uuid = placeholder_uuid(index, _attempt(problems, lambda: _bus_id(library, handle)) or "")
    position = _optional(problems, library, "board_position", lambda: library.uint("board_position", handle))
    chip = Chip(uuid=uuid, minor=None, product=UNKNOWN)
    return Device(index=index, handle=handle.value, chip=chip, position=position)


def _uuid(library: Library, handle: HANDLE) -> str:
    uuid = library.string("uuid", handle, size=_UUID_BUFFER_SIZE)
    if not uuid:
        raise CallError(library.symbol("uuid"), NVML_SUCCESS, "empty UUID")
    return uuid


def _attempt(problems: list[str], read: Callable[[], _T]) -> _T | None:
    """read(), or None with the failure added to problems."""
    try:
        return read()
    except CallError as exc:
        problems.append(str(exc))
        return None


def _optional(problems: list[str], library: Library, call: str, read: Callable[[], _T]) -> _T | None:
    """read() for a call the library may lack or not support: None then, and a problem on other failures."""
    if not library.has(call):
        return None
    try:
        return read()
    except CallError as exc:
        if not exc.not_supported:
            problems.append(str(exc))
        return None


def _bus_id(library: Library, handle: HANDLE) -> str:
    info = PciInfo()
    library.call("pci", handle, ctypes.byref(info))
    for raw in (info.busId, info.busIdLegacy):
        bus_id = normalize_bus_id(raw.decode(errors="replace"))
        if bus_id:
            return bus_id
    return f"{info.domain:04x}:{info.bus:02x}:{info.device:02x}.0"


def _memory_mib(library: Library, handle: HANDLE) -> int:
    memory = Memory()
    library.call("memory", handle, ctypes.byref(memory))
    return int(memory.total // MIB)
