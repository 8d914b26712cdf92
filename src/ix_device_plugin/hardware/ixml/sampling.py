"""One chip's telemetry from IXML, read as ix-exporter's binding reads it."""

from __future__ import annotations

import ctypes
import logging
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
            out = ctype()
            try:
                library.call(call, handle, *args, ctypes.byref(out))
            except CallError as exc:
                self._note(
                    call,
                    f"{library.symbol(call)} is not supported" if exc.not_supported else f"{device.chip.uuid}: {exc}",
                )
                return None
            return out

        return read

    def _note(self, call: str, problem: str) -> None:
        if self._problems.get(call) != problem:
            self._problems[call] = problem
            log.info("telemetry: %s; that figure is left out", problem)


def _value(out: Any) -> float | None:
    return None if out is None else float(out.value)
