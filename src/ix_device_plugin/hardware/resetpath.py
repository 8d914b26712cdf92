"""Who runs `ixsmi -r` for this process, and whether a reset can work at all here.

ixsmi -r needs privilege (Iluvatar's plugin runs it privileged; it rebinds the chip in
/sys/bus/pci/drivers/iluvatar). The agent runs unprivileged by default, so it has three ways:

- helper: the privileged reset helper in the agent's pod (`ix-device-plugin reset-helper`, resethelper/) runs it,
  asked over a unix socket one chip at a time;
- local: this process runs it (a privileged agent: the chart's privileged fallback, or privileged: true);
- none: resets are unavailable (the chart's strict mode, or its reset helper turned off).

`auto` takes the helper where a socket is named, else runs it locally. Each way says, before anything is asked of
other IXML users, whether it can reset: `problem()` is None, or a sentence naming what is missing and the value
that provides it, which the healer and Allocate say as they are (one Event, one answer), instead of a doomed try.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.resetaccess import local_reset_problem
from ix_device_plugin.hardware.resetprotocol import CANNOT_RESET

# What gives an unprivileged agent its resets, as the chart spells it.
CHART_FIX = "the chart's reset helper (resetHelper.enabled: true with strict: false, the defaults) or privileged: true"
NONE_WHY = (
    "no reset path is given to the agent (IX_RESET_VIA=none: the chart's strict: true, or resetHelper.enabled: "
    f"false) and ixsmi -r needs privilege; to reset here: {CHART_FIX}"
)


NOT_THERE = "no reset helper at"  # the client's words when nothing listens on the socket


class ResetUnavailable(BackendError):
    """Nothing was reset, and no reset can work here as the agent is deployed: the message says what is missing."""


class ResetRefusedNow(BackendError):
    """Nothing was reset this time (the helper was busy, or over its rate limit): try again later."""


class Resetter(Protocol):
    """Runs ixsmi -r for a backend (from its worker thread)."""

    def problem(self) -> str | None:
        """Why no reset can work here, with what provides one; None when one can."""
        ...

    def run(self, uuids: Sequence[str], timeout: float, abort: threading.Event | None) -> None:
        """Reset these chips; BackendError (ResetUnavailable, ResetRefusedNow: nothing was reset) when it fails."""
        ...


@dataclass(frozen=True)
class LocalReset:
    """ixsmi run by this process; ixsmi_path None: the simulated backend is its own ixsmi, as strict as the real
    one (it refuses without what ixsmi -r needs). drivers_dir: the PCI driver directory ixsmi -r writes."""

    ixsmi_path: str | None
    drivers_dir: Path

    def problem(self) -> str | None:
        missing = local_reset_problem(self.drivers_dir)
        if missing is None:
            return None
        return f"{missing}: ixsmi -r needs privilege and this process runs ixsmi itself; to reset here: {CHART_FIX}"

    def run(self, uuids: Sequence[str], timeout: float, abort: threading.Event | None) -> None:
        if self.ixsmi_path is None:
            missing = local_reset_problem(self.drivers_dir)
            if missing is not None:
                raise BackendError(f"simulated ixsmi -r -i {','.join(uuids)}: {missing}")
            return
        from ix_device_plugin.hardware.ixml.reset import run_ixsmi_reset

        run_ixsmi_reset(self.ixsmi_path, uuids, timeout, abort)


@dataclass(frozen=True)
class HelperReset:
    """ixsmi run by the privileged reset helper at socket, one chip per request."""

    socket: str

    def problem(self) -> str | None:
        """The helper's own answer that it cannot reset (no privilege); a helper not answering now (restarting) is
        no such answer: the reset is tried, and refused for now if it still does not answer."""
        from ix_device_plugin.hardware.resetclient import ResetHelperClient

        why = ResetHelperClient(self.socket).status()
        return f"the reset helper cannot reset: {why}" if why is not None and CANNOT_RESET in why else None

    def run(self, uuids: Sequence[str], timeout: float, abort: threading.Event | None) -> None:
        from ix_device_plugin.hardware.resetclient import ResetHelperClient, ResetRefused

        client = ResetHelperClient(self.socket)
        for uuid in uuids:
            try:
                client.reset(uuid, timeout, abort)
            except ResetRefused as refused:
                if CANNOT_RESET in str(refused):
                    raise ResetUnavailable(f"the reset helper cannot reset: {refused}") from None
                raise ResetRefusedNow(str(refused)) from None
            except BackendError as error:
                if str(error).startswith(NOT_THERE):  # nothing was asked: the helper is not running now
                    raise ResetRefusedNow(str(error)) from None
                raise


@dataclass(frozen=True)
class NoReset:
    """Resets are unavailable: why says what is missing and what provides it."""

    why: str = NONE_WHY

    def problem(self) -> str | None:
        return self.why

    def run(self, uuids: Sequence[str], timeout: float, abort: threading.Event | None) -> None:
        raise ResetUnavailable(self.why)


def resetter_for(via: str, helper_socket: str, ixsmi_path: str | None, drivers_dir: Path) -> Resetter:
    """The way the settings name (--reset-via, --reset-helper-socket): see the module docstring."""
    if via == "none":
        return NoReset()
    if via == "helper" or (via == "auto" and helper_socket):
        if not helper_socket:
            return NoReset("IX_RESET_VIA=helper names no reset helper socket (IX_RESET_HELPER_SOCKET)")
        return HelperReset(helper_socket)
    return LocalReset(ixsmi_path, drivers_dir)
