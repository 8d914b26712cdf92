"""The IXML library through ctypes: finding and loading libixml.so, its structs, and one binding per call.

IXML keeps NVML's C ABI (nvml* names, return codes, structs) and adds a few ixml* calls. Each logical
call binds to the newest symbol the loaded library exports; a call it lacks is simply absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterable
from typing import Any

from ix_device_plugin.hardware.backend import BackendError

DEFAULT_LIBRARY_PATHS: tuple[str, ...] = (
    "/usr/local/corex/lib64/libixml.so",
    "/usr/local/corex/lib/libixml.so",
)
LIBRARY_NAME = "libixml.so"

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t."""

    _fields_ = (
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    )


class Memory(ctypes.Structure):
    """nvmlMemory_t."""

    _fields_ = (
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    )


class Utilization(ctypes.Structure):
    """nvmlUtilization_t."""

    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class EventData(ctypes.Structure):
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
HANDLE = ctypes.c_void_p

# Logical call -> (symbols, newest first; argument types). All return nvmlReturn_t.
CALLS: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {
    "init": (("nvmlInit_v2", "nvmlInit"), ()),
    "shutdown": (("nvmlShutdown",), ()),
    "driver_version": (("nvmlSystemGetDriverVersion",), (ctypes.c_char_p, ctypes.c_uint)),
    "cuda_version": (("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"), (_P(ctypes.c_int),)),
    "count": (("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"), (_P(ctypes.c_uint),)),
    "handle": (
        ("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"),
        (ctypes.c_uint, _P(HANDLE)),
    ),
    "uuid": (("nvmlDeviceGetUUID",), (HANDLE, ctypes.c_char_p, ctypes.c_uint)),
    "name": (("nvmlDeviceGetName",), (HANDLE, ctypes.c_char_p, ctypes.c_uint)),
    "minor": (("nvmlDeviceGetMinorNumber",), (HANDLE, _P(ctypes.c_uint))),
    "pci": (("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo"), (HANDLE, _P(PciInfo))),
    "memory": (("nvmlDeviceGetMemoryInfo",), (HANDLE, _P(Memory))),
    "board_position": (("ixmlDeviceGetBoardPosition",), (HANDLE, _P(ctypes.c_uint))),
    "same_board": (("nvmlDeviceOnSameBoard",), (HANDLE, HANDLE, _P(ctypes.c_int))),
    "health": (("ixmlDeviceGetHealth",), (HANDLE, _P(ctypes.c_ulonglong))),
    "topology": (("nvmlDeviceGetTopologyCommonAncestor",), (HANDLE, HANDLE, _P(ctypes.c_int))),
    # Telemetry, as ix-exporter's binding calls it.
    "temperature": (("nvmlDeviceGetTemperature",), (HANDLE, ctypes.c_int, _P(ctypes.c_uint))),
    "fan": (("nvmlDeviceGetFanSpeed",), (HANDLE, _P(ctypes.c_uint))),
    "power": (("nvmlDeviceGetPowerUsage",), (HANDLE, _P(ctypes.c_uint))),
    "board_power": (("ixmlDeviceGetBoardPowerUsage",), (HANDLE, _P(ctypes.c_uint))),
    "clock": (("nvmlDeviceGetClockInfo",), (HANDLE, ctypes.c_int, _P(ctypes.c_uint))),
    "utilization": (("nvmlDeviceGetUtilizationRates",), (HANDLE, _P(Utilization))),
    "pcie": (("nvmlDeviceGetPcieThroughput",), (HANDLE, ctypes.c_int, _P(ctypes.c_uint))),
    "ecc": (("nvmlDeviceGetTotalEccErrors",), (HANDLE, ctypes.c_int, ctypes.c_int, _P(ctypes.c_ulonglong))),
    # XID events, as NVML's event API (go-ixml's binding loads the same four).
    "event_set_create": (("nvmlEventSetCreate",), (_P(HANDLE),)),
    "register_events": (("nvmlDeviceRegisterEvents",), (HANDLE, ctypes.c_ulonglong, HANDLE)),
    "event_wait": (("nvmlEventSetWait_v2", "nvmlEventSetWait"), (HANDLE, _P(EventData), ctypes.c_uint)),
    "event_set_free": (("nvmlEventSetFree",), (HANDLE,)),
}
_REQUIRED_CALLS = ("init", "shutdown", "count", "handle", "uuid", "minor")
_INIT_SYMBOLS = CALLS["init"][0]

# One lock for every call into the library: it is process-wide state.
LIBRARY_LOCK = threading.Lock()


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


class CallError(Exception):
    """One library call answered something other than success."""

    def __init__(self, symbol: str, code: int, message: str) -> None:
        super().__init__(f"{symbol} failed: {message}")
        self.code = code

    @property
    def not_supported(self) -> bool:
        return self.code == NVML_ERROR_NOT_SUPPORTED


class Library:
    """The library's calls, bound to the newest symbol it exports."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self._symbols: dict[str, str] = {}
        self._functions: dict[str, Any] = {}
        for call, (symbols, argtypes) in CALLS.items():
            for symbol in symbols:
                if _has_symbol(lib, symbol):
                    function = getattr(lib, symbol)
                    function.argtypes = argtypes
                    function.restype = ctypes.c_int
                    self._symbols[call] = symbol
                    self._functions[call] = function
                    break
        missing = [CALLS[call][0][0] for call in _REQUIRED_CALLS if call not in self._functions]
        if missing:
            raise BackendError(f"IXML library {path} lacks {', '.join(missing)}")
        self._error_string: Any = None
        if _has_symbol(lib, "nvmlErrorString"):
            error_string = lib.nvmlErrorString  # its signature declared on it, as ctypes asks
            error_string.argtypes = (ctypes.c_int,)
            error_string.restype = ctypes.c_char_p
            self._error_string = error_string

    def has(self, call: str) -> bool:
        return call in self._functions

    def symbol(self, call: str) -> str:
        return self._symbols.get(call, CALLS[call][0][0])

    def call(self, call: str, *args: Any) -> None:
        """Runs one call; raises CallError unless it succeeds."""
        code = self.code(call, *args)
        if code != NVML_SUCCESS:
            raise CallError(self.symbol(call), code, self.error_string(code))

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

    def uint(self, call: str, handle: HANDLE) -> int:
        """A call that fills one unsigned int for a device."""
        value = ctypes.c_uint()
        self.call(call, handle, ctypes.byref(value))
        return value.value
