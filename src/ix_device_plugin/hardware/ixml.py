"""Devices from Iluvatar's IXML management library (libixml.so), called through ctypes.

IXML keeps NVML's C ABI (nvml* names, return codes, structs) and adds a few ixml* calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ix_device_plugin.core.inventory import (
    Board,
    Chip,
    ChipStatus,
    Inventory,
    health_errors_from_mask,
    link_key,
)
from ix_device_plugin.core.telemetry import ChipSample
from ix_device_plugin.hardware.backend import DEFAULT_IXSMI, BackendError, XidEvent, XidSink
from ix_device_plugin.hardware.devnodes import check_device_nodes, node_checked_status

log = logging.getLogger(__name__)

_T = TypeVar("_T")

DEFAULT_LIBRARY_PATHS: tuple[str, ...] = (
    "/usr/local/corex/lib64/libixml.so",
    "/usr/local/corex/lib/libixml.so",
)
LIBRARY_NAME = "libixml.so"
PLACEHOLDER_UUID_PREFIX = "IX-UNKNOWN-"
UNKNOWN_PRODUCT = "unknown"

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_EVENT_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError; the event's data is the XID number
EVENT_WAIT_MS = 500  # one nvmlEventSetWait_v2 call waits at most this long, so the waiter stops promptly

_UUID_BUFFER_SIZE = 80
_NAME_BUFFER_SIZE = 64
_DRIVER_VERSION_BUFFER_SIZE = 80
_MIB = 1024 * 1024
_BUS_ID = re.compile(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)$")


class NoDevicesError(BackendError):
    """The library works but lists no devices."""


class _PciInfo(ctypes.Structure):
    _fields_ = (
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    )


class _Memory(ctypes.Structure):
    _fields_ = (
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    )


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _EventData(ctypes.Structure):
    """nvmlEventData_t."""

    _fields_ = (
        ("device", ctypes.c_void_p),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    )


class _LinkMap(ctypes.Structure):
    """The head of glibc's struct link_map, as dlinfo(RTLD_DI_LINKMAP) returns it."""

    _fields_ = (("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p))


_RTLD_DI_LINKMAP = 2
_P = ctypes.POINTER
_HANDLE = ctypes.c_void_p

# Logical call -> (symbols, newest first; argument types). All return nvmlReturn_t.
_CALLS: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {
    "init": (("nvmlInit_v2", "nvmlInit"), ()),
    "shutdown": (("nvmlShutdown",), ()),
    "driver_version": (("nvmlSystemGetDriverVersion",), (ctypes.c_char_p, ctypes.c_uint)),
    "cuda_version": (("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"), (_P(ctypes.c_int),)),
    "count": (("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"), (_P(ctypes.c_uint),)),
    "handle": (
        ("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"),
        (ctypes.c_uint, _P(_HANDLE)),
    ),
    "uuid": (("nvmlDeviceGetUUID",), (_HANDLE, ctypes.c_char_p, ctypes.c_uint)),
    "name": (("nvmlDeviceGetName",), (_HANDLE, ctypes.c_char_p, ctypes.c_uint)),
    "minor": (("nvmlDeviceGetMinorNumber",), (_HANDLE, _P(ctypes.c_uint))),
    "pci": (("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo"), (_HANDLE, _P(_PciInfo))),
    "memory": (("nvmlDeviceGetMemoryInfo",), (_HANDLE, _P(_Memory))),
    "board_position": (("ixmlDeviceGetBoardPosition",), (_HANDLE, _P(ctypes.c_uint))),
    "same_board": (("nvmlDeviceOnSameBoard",), (_HANDLE, _HANDLE, _P(ctypes.c_int))),
    "health": (("ixmlDeviceGetHealth",), (_HANDLE, _P(ctypes.c_ulonglong))),
    "topology": (("nvmlDeviceGetTopologyCommonAncestor",), (_HANDLE, _HANDLE, _P(ctypes.c_int))),
    # Telemetry, as ix-exporter's binding calls it.
    "temperature": (("nvmlDeviceGetTemperature",), (_HANDLE, ctypes.c_int, _P(ctypes.c_uint))),
    "fan": (("nvmlDeviceGetFanSpeed",), (_HANDLE, _P(ctypes.c_uint))),
    "power": (("nvmlDeviceGetPowerUsage",), (_HANDLE, _P(ctypes.c_uint))),
    "board_power": (("ixmlDeviceGetBoardPowerUsage",), (_HANDLE, _P(ctypes.c_uint))),
    "clock": (("nvmlDeviceGetClockInfo",), (_HANDLE, ctypes.c_int, _P(ctypes.c_uint))),
    "utilization": (("nvmlDeviceGetUtilizationRates",), (_HANDLE, _P(_Utilization))),
    "pcie": (("nvmlDeviceGetPcieThroughput",), (_HANDLE, ctypes.c_int, _P(ctypes.c_uint))),
    "ecc": (("nvmlDeviceGetTotalEccErrors",), (_HANDLE, ctypes.c_int, ctypes.c_int, _P(ctypes.c_ulonglong))),
    # XID events, as NVML's event API (go-ixml's binding loads the same four).
    "event_set_create": (("nvmlEventSetCreate",), (_P(_HANDLE),)),
    "register_events": (("nvmlDeviceRegisterEvents",), (_HANDLE, ctypes.c_ulonglong, _HANDLE)),
    "event_wait": (("nvmlEventSetWait_v2", "nvmlEventSetWait"), (_HANDLE, _P(_EventData), ctypes.c_uint)),
    "event_set_free": (("nvmlEventSetFree",), (_HANDLE,)),
}
_EVENT_CALLS = ("event_set_create", "register_events", "event_wait", "event_set_free")
_TEMPERATURE_GPU, _CLOCK_SM, _CLOCK_MEM, _PCIE_TX, _PCIE_RX = 0, 1, 2, 0, 1
_ECC_CORRECTED, _ECC_UNCORRECTED, _ECC_VOLATILE = 0, 1, 0
_MIB = 1024 * 1024
_REQUIRED_CALLS = ("init", "shutdown", "count", "handle", "uuid", "minor")
_INIT_SYMBOLS = _CALLS["init"][0]

# One lock for every call into the library: it is process-wide state.
_LIBRARY_LOCK = threading.Lock()


def find_library(explicit: str | None, *, candidates: Iterable[str] = DEFAULT_LIBRARY_PATHS) -> str:
    """Path (or loader name) of the IXML library to load: explicit, a CoreX default, or the search path."""
    if explicit:
        if os.sep in explicit and not os.path.exists(explicit):
            raise BackendError(f"IXML library {explicit} does not exist")
        return explicit
    for path in candidates:
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("ixml") or LIBRARY_NAME


def load_library(path: str) -> ctypes.CDLL:
    """The loaded IXML library at path; BackendError when it cannot be loaded or is not IXML."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        searched = ""
        if os.sep not in path:
            searched = (
                f" (not in {', '.join(DEFAULT_LIBRARY_PATHS)} nor on the loader's search path; is the CoreX "
                "driver stack installed and /usr/local/corex mounted? --ixml-library or IX_IXML_LIBRARY names it)"
            )
        raise BackendError(f"cannot load the IXML library {path}: {exc}{searched}") from exc
    if not any(_has_symbol(lib, name) for name in _INIT_SYMBOLS):
        raise BackendError(
            f"{library_file(lib)} is not Iluvatar's IXML library (it has no nvmlInit_v2 or nvmlInit; "
            "libupnp's XML parser is also called libixml.so)"
        )
    return lib


def library_file(lib: ctypes.CDLL) -> str:
    """The file a loaded library came from, or the name it was loaded by when that is unknown."""
    try:
        libc = ctypes.CDLL(None)
        link_map = ctypes.POINTER(_LinkMap)()
        if libc.dlinfo(ctypes.c_void_p(lib._handle), _RTLD_DI_LINKMAP, ctypes.byref(link_map)) == 0:
            name = link_map.contents.l_name
            if name:
                return os.fsdecode(name)
    except (AttributeError, OSError, ValueError):
        pass
    return str(lib._name)


def _has_symbol(lib: ctypes.CDLL, name: str) -> bool:
    try:
        getattr(lib, name)
    except AttributeError:
        return False
    return True


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


class _CallError(Exception):
    """One library call answered something other than success."""

    def __init__(self, symbol: str, code: int, message: str) -> None:
        super().__init__(f"{symbol} failed: {message}")
        self.code = code

    @property
    def not_supported(self) -> bool:
        return self.code == NVML_ERROR_NOT_SUPPORTED


class _Library:
    """The library's calls, bound to the newest symbol it exports."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self._symbols: dict[str, str] = {}
        self._functions: dict[str, Any] = {}
        for call, (symbols, argtypes) in _CALLS.items():
            for symbol in symbols:
                if _has_symbol(lib, symbol):
                    function = getattr(lib, symbol)
                    function.argtypes = argtypes
                    function.restype = ctypes.c_int
                    self._symbols[call] = symbol
                    self._functions[call] = function
                    break
        missing = [_CALLS[call][0][0] for call in _REQUIRED_CALLS if call not in self._functions]
        if missing:
            raise BackendError(f"IXML library {path} lacks {', '.join(missing)}")
        self._error_string: Any = None
        if _has_symbol(lib, "nvmlErrorString"):
            self._error_string = lib.nvmlErrorString
            self._error_string.argtypes = (ctypes.c_int,)
            self._error_string.restype = ctypes.c_char_p

    def has(self, call: str) -> bool:
        return call in self._functions

    def symbol(self, call: str) -> str:
        return self._symbols.get(call, _CALLS[call][0][0])

    def call(self, call: str, *args: Any) -> None:
        """Runs one call; raises _CallError unless it succeeds."""
        code = self.code(call, *args)
        if code != NVML_SUCCESS:
            raise _CallError(self.symbol(call), code, self.error_string(code))

    def code(self, call: str, *args: Any) -> int:
        """Runs one call and returns what it answered (nvmlReturn_t)."""
        return int(self._functions[call](*args))

    def error_string(self, code: int) -> str:
        if self._error_string is not None:
            text = self._error_string(code)
            if text:
                return text.decode(errors="replace")
        return f"error {code}"

    def string(self, call: str, *args: Any, size: int) -> str:
        buffer = ctypes.create_string_buffer(size)
        self.call(call, *args, buffer, size)
        return buffer.value.decode(errors="replace")


class _XidWaiter:
    """A thread of its own that waits on one IXML event set and hands each critical XID to a sink.

    Each nvmlEventSetWait_v2 call waits at most EVENT_WAIT_MS, then the stop flag is checked, so
    stop() returns within about that long; the library is never shut down while a wait is under way.
    The wait runs without _LIBRARY_LOCK (NVML's event wait may run alongside other calls).
    """

    def __init__(self, library: _Library, event_set: _HANDLE, uuids: Mapping[int, str], sink: XidSink) -> None:
        self.targets = tuple(sorted(uuids.items()))
        self._library = library
        self._set = event_set
        self._uuids = dict(uuids)
        self._sink = sink
        self._stop = threading.Event()
        self._last_problem = ""
        self._thread = threading.Thread(target=self._run, name="ix-xid-events", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> bool:
        """Stop waiting and free the event set; False when the thread is still inside the library."""
        self._stop.set()
        self._thread.join(timeout=EVENT_WAIT_MS / 1000 + 1.0)
        if self._thread.is_alive():
            return False
        _free_event_set(self._library, self._set)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            data = _EventData()
            code = self._library.code("event_wait", self._set, ctypes.byref(data), EVENT_WAIT_MS)
            if code == NVML_ERROR_TIMEOUT:
                continue
            if code != NVML_SUCCESS:
                self._note(f"{self._library.symbol('event_wait')} failed: {self._library.error_string(code)}")
                self._stop.wait(EVENT_WAIT_MS / 1000)  # do not spin on a failing wait; polling still runs
                continue
            self._note("")
            if data.eventType & NVML_EVENT_XID_CRITICAL:
                self._deliver(data)

    def _deliver(self, data: _EventData) -> None:
        uuid = self._uuids.get(data.device or 0)
        if uuid is None:
            log.warning("XID %d on a device IXML did not name; health polling covers it", data.eventData)
            return
        try:
            self._sink(XidEvent(uuid=uuid, xid=int(data.eventData)))
        except Exception as error:  # the sink's failure must not end the waiter
            log.warning("XID %d on %s was not handed on: %s", data.eventData, uuid, error)

    def _note(self, problem: str) -> None:
        """Log a new wait failure once, and its end once."""
        if problem == self._last_problem:
            return
        if problem:
            log.warning("XID events: %s; health polling goes on", problem)
        else:
            log.info("XID events arrive again")
        self._last_problem = problem


def _free_event_set(library: _Library, event_set: _HANDLE) -> None:
    try:
        library.call("event_set_free", event_set)
    except _CallError as exc:
        log.warning("XID events: %s", exc)


@dataclass(frozen=True)
class _Device:
    """What one enumeration learnt about one device."""

    index: int
    handle: int | None
    chip: Chip
    # Position on its board; None when the library cannot say.
    position: int | None = None


class IxmlBackend:
    """Chips and their health from Iluvatar's IXML library."""

    name = "ixml"
    has_device_nodes = True

    def __init__(
        self,
        library_path: str | None = None,
        dev_root: str | Path = "/",
        sysfs_root: str | Path = "/sys",
        ixsmi_path: str = DEFAULT_IXSMI,
    ) -> None:
        self._library_path = library_path
        self._ixsmi_path = ixsmi_path
        self._dev_root = Path(dev_root)
        self._sysfs_root = Path(sysfs_root)
        self._library: _Library | None = None
        self._initialized = False
        self._health_unavailable_logged = False
        self._telemetry_problems: dict[str, str] = {}
        self._xid_sink: XidSink | None = None
        self._xid_waiter: _XidWaiter | None = None
        self._xid_unavailable_logged = False
        self._xid_stuck = False  # a waiter that did not stop: the library is left initialised

    def discover(self) -> Inventory:
        """Every board and chip with its current status; raises BackendError when it cannot."""
        with _LIBRARY_LOCK:
            library = self._start()
            devices = self._enumerate(library)
            if not devices:
                raise NoDevicesError(f"IXML library {library.path} reports no Iluvatar devices")
            inventory = Inventory(
                boards=self._boards(library, devices),
                driver_version=self._driver_version(library),
                cuda_version=self._cuda_version(library),
                links=self._links(library, devices),
            )
            self._watch(library, devices)
        return check_device_nodes(inventory, self._dev_root)

    def watch_xids(self, sink: XidSink) -> None:
        """From the next discover() on, hand each critical XID event to sink, from a thread of its own."""
        with _LIBRARY_LOCK:
            self._xid_sink = sink

    def _watch(self, library: _Library, devices: Sequence[_Device]) -> None:
        """Wait for XID events of these devices (again, when they changed or the waiter stopped)."""
        if self._xid_sink is None:
            return
        uuids = {device.handle: device.chip.uuid for device in devices if device.handle is not None}
        waiter = self._xid_waiter
        if waiter is not None and waiter.alive and waiter.targets == tuple(sorted(uuids.items())):
            return
        if not self._stop_xid_waiter():
            return
        missing = [_CALLS[call][0][0] for call in _EVENT_CALLS if not library.has(call)]
        if missing:
            self._note_xid_unavailable(f"{library.path} lacks {', '.join(missing)}")
            return
        event_set = self._register(library, uuids)
        if event_set is not None:
            self._xid_waiter = _XidWaiter(library, event_set, uuids, self._xid_sink)

    def _register(self, library: _Library, uuids: dict[int, str]) -> _HANDLE | None:
        """A new event set with every device that supports XID events (uuids keeps only those); None if none."""
        event_set = _HANDLE()
        try:
            library.call("event_set_create", ctypes.byref(event_set))
        except _CallError as exc:
            self._note_xid_unavailable(str(exc))
            return None
        unsupported = []
        for handle, uuid in list(uuids.items()):
            try:
                library.call("register_events", _HANDLE(handle), NVML_EVENT_XID_CRITICAL, event_set)
            except _CallError as exc:
                del uuids[handle]
                if exc.not_supported:
                    unsupported.append(uuid)
                else:
                    log.warning("XID events: %s: %s; that chip's health comes from polling only", uuid, exc)
        if unsupported:
            log.info("XID events are not supported on %s; health polling covers them", ", ".join(unsupported))
        if not uuids:
            _free_event_set(library, event_set)
            self._note_xid_unavailable(f"{library.symbol('register_events')} registers no chip")
            return None
        log.info("waiting for XID events of %d chips", len(uuids))
        return event_set

    def _stop_xid_waiter(self) -> bool:
        """Stop the XID waiter, if any; False when it did not stop (it is still inside the library)."""
        if self._xid_stuck:
            return False
        waiter, self._xid_waiter = self._xid_waiter, None
        if waiter is None or waiter.stop():
            return True
        self._xid_stuck = True
        log.error(
            "the XID event waiter did not return from %s; IXML is left initialised and XID events stop "
            "(health polling goes on)",
            self._library.symbol("event_wait") if self._library else "nvmlEventSetWait_v2",
        )
        return False

    def _note_xid_unavailable(self, why: str) -> None:
        if not self._xid_unavailable_logged:
            self._xid_unavailable_logged = True
            log.warning("no IXML XID events (%s): chip health comes from polling alone", why)

    def health(self, inventory: Inventory) -> Mapping[str, ChipStatus]:
        """Current status of each chip of inventory, by UUID; chips it cannot reach are not present."""
        try:
            with _LIBRARY_LOCK:
                library = self._start()
                devices = self._enumerate(library)
        except BackendError as exc:
            lost = ChipStatus(present=False, problems=(str(exc),))
            return {chip.uuid: lost for chip in inventory.chips()}
        by_uuid = {device.chip.uuid: device.chip for device in devices}
        by_bus = {device.chip.bus_id: device.chip for device in devices if device.chip.bus_id}
        statuses: dict[str, ChipStatus] = {}
        for chip in inventory.chips():
            current = by_uuid.get(chip.uuid) or _unidentified_at(by_bus, chip.bus_id)
            if current is None:
                statuses[chip.uuid] = ChipStatus(present=False)
            else:
                statuses[chip.uuid] = node_checked_status(current, self._dev_root)
        return statuses

    def sample(self, inventory: Inventory) -> dict[str, ChipSample]:
        """Every chip's telemetry in one pass; a call the library lacks or does not support gives None."""
        with _LIBRARY_LOCK:
            library = self._start()
            devices = self._enumerate(library)
            return {device.chip.uuid: self._sample(library, device) for device in devices if device.handle is not None}

    def _sample(self, library: _Library, device: _Device) -> ChipSample:
        read = self._reader(library, device)
        memory = read("memory", _Memory)
        utilization = read("utilization", _Utilization)
        power_call = "board_power" if device.position is not None and library.has("board_power") else "power"
        power = read(power_call, ctypes.c_uint)
        sbe = read("ecc", ctypes.c_ulonglong, _ECC_CORRECTED, _ECC_VOLATILE)
        dbe = read("ecc", ctypes.c_ulonglong, _ECC_UNCORRECTED, _ECC_VOLATILE)
        return ChipSample(
            temperature_c=_value(read("temperature", ctypes.c_uint, _TEMPERATURE_GPU)),
            fan_speed=_value(read("fan", ctypes.c_uint)),
            power_w=None if power is None else power.value / 1000,
            sm_clock_mhz=_value(read("clock", ctypes.c_uint, _CLOCK_SM)),
            mem_clock_mhz=_value(read("clock", ctypes.c_uint, _CLOCK_MEM)),
            gpu_utilization=None if utilization is None else utilization.gpu,
            mem_utilization=None if utilization is None else utilization.memory,
            mem_total_mib=None if memory is None else memory.total / _MIB,
            mem_used_mib=None if memory is None else memory.used / _MIB,
            mem_free_mib=None if memory is None else memory.free / _MIB,
            pcie_tx_kbps=_value(read("pcie", ctypes.c_uint, _PCIE_TX)),
            pcie_rx_kbps=_value(read("pcie", ctypes.c_uint, _PCIE_RX)),
            ecc_sbe_volatile=None if sbe is None else float(sbe.value > 0),
            ecc_dbe_volatile=None if dbe is None else float(dbe.value > 0),
        )

    def _reader(self, library: _Library, device: _Device) -> Callable[..., Any]:
        """read(call, ctype, *leading args) -> the filled ctype, or None (said once per call and problem)."""
        handle = _HANDLE(device.handle)

        def read(call: str, ctype: Any, *args: Any) -> Any:
            if not library.has(call):
                self._note_telemetry(call, f"{_CALLS[call][0][0]} is not in {library.path}")
                return None
            out = ctype()
            try:
                library.call(call, handle, *args, ctypes.byref(out))
            except _CallError as exc:
                self._note_telemetry(
                    call,
                    f"{library.symbol(call)} is not supported" if exc.not_supported else f"{device.chip.uuid}: {exc}",
                )
                return None
            return out

        return read

    def _note_telemetry(self, call: str, problem: str) -> None:
        if self._telemetry_problems.get(call) != problem:
            self._telemetry_problems[call] = problem
            log.info("telemetry: %s; that figure is left out", problem)

    def reset(self, uuids: Sequence[str], timeout: float) -> None:
        """Shut the library down and run `ixsmi -r -i <uuids>`; BackendError with ixsmi's words on failure."""
        self.close()
        command = [self._ixsmi_path, "-r", "-i", ",".join(uuids)]
        shown = " ".join(command)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise BackendError(f"{self._ixsmi_path} not found: install CoreX's ixsmi or set --ixsmi-path") from None
        except PermissionError:
            raise BackendError(f"{self._ixsmi_path} is not executable") from None
        except subprocess.TimeoutExpired:
            raise BackendError(f"{shown} did not finish within {timeout:g}s") from None
        output = " ".join((done.stdout + done.stderr).split())[-500:]
        if done.returncode != 0:
            raise BackendError(f"{shown} exited with code {done.returncode}: {output or 'no output'}")
        log.info("%s: %s", shown, output or "done")

    def close(self) -> None:
        """Stop the XID waiter, then shut the library down; a later discover() starts it again."""
        with _LIBRARY_LOCK:
            if not self._stop_xid_waiter():
                return  # shutting down under a thread that is inside the library would pull it from under it
            if self._library is not None and self._initialized:
                try:
                    self._library.call("shutdown")
                except _CallError as exc:
                    log.warning("IXML shutdown: %s", exc)
            self._initialized = False

    def _start(self) -> _Library:
        if self._library is None:
            path = find_library(self._library_path)
            self._library = _Library(load_library(path), path)
        if not self._initialized:
            try:
                self._library.call("init")
            except _CallError as exc:
                raise BackendError(f"IXML library {self._library.path} failed to initialise: {exc}") from exc
            self._initialized = True
        return self._library

    def _enumerate(self, library: _Library) -> list[_Device]:
        count = ctypes.c_uint()
        try:
            library.call("count", ctypes.byref(count))
        except _CallError as exc:
            raise BackendError(f"IXML library {library.path} cannot count devices: {exc}") from exc
        return [self._read_device(library, index) for index in range(count.value)]

    def _read_device(self, library: _Library, index: int) -> _Device:
        handle = _HANDLE()
        try:
            library.call("handle", index, ctypes.byref(handle))
        except _CallError as exc:
            chip = Chip(
                uuid=placeholder_uuid(index, ""),
                minor=None,
                product=UNKNOWN_PRODUCT,
                status=ChipStatus(problems=(str(exc),)),
            )
            return _Device(index=index, handle=None, chip=chip)
        problems: list[str] = []
        uuid = _attempt(problems, lambda: self._uuid(library, handle))
        product = _attempt(problems, lambda: library.string("name", handle, size=_NAME_BUFFER_SIZE))
        minor = _attempt(problems, lambda: _read_uint(library, "minor", handle))
        bus_id = _attempt(problems, lambda: _bus_id(library, handle)) or ""
        memory = _attempt(problems, lambda: _memory_mib(library, handle))
        position = _optional(problems, library, "board_position", lambda: _read_uint(library, "board_position", handle))
        chip = Chip(
            uuid=uuid or placeholder_uuid(index, bus_id),
            minor=minor,
            product=product or UNKNOWN_PRODUCT,
            bus_id=bus_id,
            numa_node=read_numa_node(self._sysfs_root, bus_id),
            memory_mib=memory or 0,
            status=ChipStatus(errors=self._health_errors(library, handle, problems), problems=tuple(problems)),
        )
        return _Device(index=index, handle=handle.value, chip=chip, position=position)

    @staticmethod
    def _uuid(library: _Library, handle: _HANDLE) -> str:
        uuid = library.string("uuid", handle, size=_UUID_BUFFER_SIZE)
        if not uuid:
            raise _CallError(library.symbol("uuid"), NVML_SUCCESS, "empty UUID")
        return uuid

    def _health_errors(self, library: _Library, handle: _HANDLE, problems: list[str]) -> frozenset[str]:
        if not library.has("health"):
            self._note_health_unavailable(library)
            return frozenset()
        mask = ctypes.c_ulonglong()
        try:
            library.call("health", handle, ctypes.byref(mask))
        except _CallError as exc:
            if exc.not_supported:
                self._note_health_unavailable(library)
            else:
                problems.append(str(exc))
            return frozenset()
        return health_errors_from_mask(mask.value)

    def _note_health_unavailable(self, library: _Library) -> None:
        if not self._health_unavailable_logged:
            self._health_unavailable_logged = True
            log.warning(
                "IXML health checks are unavailable (%s lacks or does not support ixmlDeviceGetHealth): "
                "chips count as healthy while their calls and device nodes work",
                library.path,
            )

    def _boards(self, library: _Library, devices: list[_Device]) -> tuple[Board, ...]:
        groups = _board_groups(library, devices)
        boards = [sorted(members, key=lambda device: (device.position or 0, device.index)) for members in groups]
        boards.sort(key=lambda members: min(device.index for device in members))
        return tuple(
            Board(product=members[0].chip.product, chips=tuple(device.chip for device in members)) for members in boards
        )

    @staticmethod
    def _driver_version(library: _Library) -> str:
        if not library.has("driver_version"):
            return ""
        try:
            return library.string("driver_version", size=_DRIVER_VERSION_BUFFER_SIZE)
        except _CallError as exc:
            log.warning("IXML driver version unknown: %s", exc)
            return ""

    @staticmethod
    def _cuda_version(library: _Library) -> str | None:
        if not library.has("cuda_version"):
            return None
        version = ctypes.c_int()
        try:
            library.call("cuda_version", ctypes.byref(version))
        except _CallError as exc:
            log.info("CUDA driver version unknown: %s", exc)
            return None
        return str(version.value)

    @staticmethod
    def _links(library: _Library, devices: list[_Device]) -> dict[tuple[str, str], int]:
        if not library.has("topology"):
            return {}
        reachable = [device for device in devices if device.handle is not None]
        links: dict[tuple[str, str], int] = {}
        for i, first in enumerate(reachable):
            for second in reachable[i + 1 :]:
                level = ctypes.c_int()
                try:
                    library.call("topology", first.handle, second.handle, ctypes.byref(level))
                except _CallError:
                    continue
                links[link_key(first.chip.uuid, second.chip.uuid)] = level.value
        return links


def _value(out: Any) -> float | None:
    return None if out is None else float(out.value)


def _attempt(problems: list[str], read: Callable[[], _T]) -> _T | None:
    """read(), or None with the failure added to problems."""
    try:
        return read()
    except _CallError as exc:
        problems.append(str(exc))
        return None


def _optional(problems: list[str], library: _Library, call: str, read: Callable[[], _T]) -> _T | None:
    """read() for a call the library may lack or not support: None then, and a problem on other failures."""
    if not library.has(call):
        return None
    try:
        return read()
    except _CallError as exc:
        if not exc.not_supported:
            problems.append(str(exc))
        return None


def _read_uint(library: _Library, call: str, handle: _HANDLE) -> int:
    value = ctypes.c_uint()
    library.call(call, handle, ctypes.byref(value))
    return value.value


def _bus_id(library: _Library, handle: _HANDLE) -> str:
    info = _PciInfo()
    library.call("pci", handle, ctypes.byref(info))
    for raw in (info.busId, info.busIdLegacy):
        bus_id = normalize_bus_id(raw.decode(errors="replace"))
        if bus_id:
            return bus_id
    return f"{info.domain:04x}:{info.bus:02x}:{info.device:02x}.0"


def _memory_mib(library: _Library, handle: _HANDLE) -> int:
    memory = _Memory()
    library.call("memory", handle, ctypes.byref(memory))
    return int(memory.total // _MIB)


def _board_groups(library: _Library, devices: list[_Device]) -> list[list[_Device]]:
    """Devices grouped by board: each chip joins the position-0 chip it shares a board with."""
    alone = [[device] for device in devices]
    if not (library.has("board_position") and library.has("same_board")):
        return alone
    leaders = [d for d in devices if d.position == 0 and d.handle is not None]
    groups: dict[int, list[_Device]] = {leader.index: [leader] for leader in leaders}
    for device in devices:
        if device.position == 0 and device.handle is not None:
            continue
        leader = None
        if device.position is not None and device.handle is not None:
            try:
                leader = _board_leader(library, device, leaders)
            except _CallError:
                return alone
        groups.setdefault(leader.index if leader else device.index, []).append(device)
    return list(groups.values())


def _board_leader(library: _Library, device: _Device, leaders: list[_Device]) -> _Device | None:
    """The position-0 chip on device's board; raises _CallError only when boards are not supported."""
    for leader in leaders:
        same = ctypes.c_int()
        try:
            library.call("same_board", leader.handle, device.handle, ctypes.byref(same))
        except _CallError as exc:
            if exc.not_supported:
                raise
            continue
        if same.value:
            return leader
    return None


def _unidentified_at(by_bus: Mapping[str, Chip], bus_id: str) -> Chip | None:
    """The chip now at bus_id when its UUID can no longer be read."""
    chip = by_bus.get(bus_id) if bus_id else None
    return chip if chip is not None and chip.uuid.startswith(PLACEHOLDER_UUID_PREFIX) else None
