"""One chip's telemetry from IXML, read as ix-exporter's binding reads it.

A read that never returns (a wedged driver) is left to its thread, which its worker abandons; the next pass,
on another thread, finds it still in flight and leaves that figure of that chip out, said once, until the
read returns. Reads hold no lock: NVML's calls are thread-safe, and health must never wait behind a hung read.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any

from ix_device_plugin.core.telemetry import ChipSample
from ix_device_plugin.hardware.ixml.devices import MIB, Device
from ix_device_plugin.hardware.ixml.library import CALLS, HANDLE, CallError, Library, Memory, Utilization

log = logging.getLogger(__name__)

_TEMPERATURE_GPU, _CLOCK_SM, _CLOCK_MEM, _PCIE_TX, _PCIE_RX = 0, 1, 2, 0, 1
_ECC_CORRECTED, _ECC_UNCORRECTED, _ECC_VOLATILE = 0, 1, 0


class Sampler:
    """Reads a device's figures; a call the library lacks or does not support gives None, said once."""

    def __init__(self) -> None:
        self._problems: dict[str, str] = {}
        self._reading: dict[int, tuple[str, str]] = {}  # thread -> (call, chip UUID) it is inside now
        self._hung: set[tuple[str, str]] = set()  # (call, chip UUID) of reads that did not return: left out

    @property
    def busy(self) -> bool:
        """True while a read is inside the library (the library must not be shut down under it)."""
        return bool(self._reading)

    def begin_pass(self) -> None:
        """Before a pass: a read still in flight on another thread hung (its worker gave up on it); one that
        hung and has returned since is read again."""
        inside = {read for thread, read in dict(self._reading).items() if thread != threading.get_ident()}
        for call, uuid in sorted(inside - self._hung):
            log.warning("telemetry: %s on %s did not return; that figure is left out until it does", call, uuid)
        for call, uuid in sorted(self._hung - inside):
            log.info("telemetry: %s on %s returned; that figure is read again", call, uuid)
        self._hung = inside

    def sample(self, library: Library, device: Device) -> ChipSample:
        read = self._reader(library, device)
        memory = read("memory", Memory)
        utilization = read("utilization", Utilization)
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
            mem_total_mib=None if memory is None else memory.total / MIB,
            mem_used_mib=None if memory is None else memory.used / MIB,
            mem_free_mib=None if memory is None else memory.free / MIB,
            pcie_tx_kbps=_value(read("pcie", ctypes.c_uint, _PCIE_TX)),
            pcie_rx_kbps=_value(read("pcie", ctypes.c_uint, _PCIE_RX)),
            ecc_sbe_volatile=None if sbe is None else float(sbe.value > 0),
            ecc_dbe_volatile=None if dbe is None else float(dbe.value > 0),
        )

    def _reader(self, library: Library, device: Device) -> Callable[..., Any]:
        """read(call, ctype, *leading args) -> the filled ctype, or None (said once per call and problem)."""
        handle = HANDLE(device.handle)

        def read(call: str, ctype: Any, *args: Any) -> Any:
            if not library.has(call):
                self._note(call, f"{CALLS[call][0][0]} is not in {library.path}")
                return None
            what = (library.symbol(call), device.chip.uuid)
            if what in self._hung:
                return None
            out = ctype()
            thread = threading.get_ident()
            self._reading[thread] = what
            try:
                library.call(call, handle, *args, ctypes.byref(out))
            except CallError as exc:
                self._note(
                    call,
                    f"{library.symbol(call)} is not supported" if exc.not_supported else f"{device.chip.uuid}: {exc}",
                )
                return None
            finally:
                del self._reading[thread]
            return out

        return read

    def _note(self, call: str, problem: str) -> None:
        if self._problems.get(call) != problem:
            self._problems[call] = problem
            log.info("telemetry: %s; that figure is left out", problem)


def _value(out: Any) -> float | None:
    return None if out is None else float(out.value)
