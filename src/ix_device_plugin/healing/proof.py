"""A reset proven before the chip returns to service.

ixsmi is closed source: its exit code alone says little (run unprivileged, or over a driver quirk, it may exit 0
without resetting anything). So after it exits 0 the healer asks the hardware itself, and the attempt counts as
failed unless every answer is right:

- the chip is enumerated again, with the same UUID (GpuReset checks it) at the same PCI address;
- its XID events are waited for again (where they were before the reset: the event set registered anew);
- no XID was reported since the reset began (one still pending was not cleared), and the rest of its health reads
  clear;
- then, when the configuration names one (health.resetDiagnostic), a diagnostic command (an IXDCGM diagnostic at a
  given level, say) exits 0 within its deadline. It runs without a shell, in a session of its own, killed with
  its whole process group when it overruns; its words are kept for the Event.

Only then are the XIDs seen before the reset forgotten (HardwareMonitor.clear_xids): until then they keep the chip
out of service, whatever a later poll reads. One exception: the chip is back as it was and no XID was reported
again, but a health error it reads (a bit the reset did not clear yet) keeps it out: the reset cleared the XIDs, so
they are forgotten, and the chip returns once that error clears (or the next attempt resets it).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from ix_device_plugin.core.healing import diagnose
from ix_device_plugin.core.inventory import Chip
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.monitor import HardwareMonitor
from ix_device_plugin.settings.health import HealthPolicy, xid_name

UUID_FIELD = "{uuid}"  # in the diagnostic's arguments: the chip's UUID


@dataclass(frozen=True)
class BeforeReset:
    """What the chip was just before its reset: where it sat, what it had reported, and whether its XID events
    were waited for; started: when the reset began (monotonic)."""

    uuid: str
    bus_id: str
    xids: frozenset[int]
    xids_live: bool | None
    started: float


async def before_reset(monitor: HardwareMonitor, chip: Chip | None, uuid: str) -> BeforeReset:
    """The chip as it is now, to prove its reset against afterwards."""
    try:
        live = await monitor.xids_live(uuid)
    except BackendError:
        live = None  # not known: not required afterwards
    bus = "" if chip is None else chip.bus_id or ""
    xids = frozenset() if chip is None else chip.status.xids
    return BeforeReset(uuid, bus, xids, live, time.monotonic())


UNPROVEN, STILL_UNHEALTHY, DIAGNOSTIC_FAILED = "unproven", "still_unhealthy", "diagnostic_failed"  # metric results
PROOF_RESULTS = (UNPROVEN, STILL_UNHEALTHY, DIAGNOSTIC_FAILED)


@dataclass(frozen=True)
class Failure:
    """Why a reset after which ixsmi exited 0 counts as failed; result: how the metric counts it. cleared: the
    hardware shows the reset done (the chip back as it was, no XID reported again) though a health error it reads
    still keeps it out: the XIDs seen before are forgotten, and the chip returns once that error clears."""

    result: str
    why: str
    cleared: bool = False


async def unproven(monitor: HardwareMonitor, before: BeforeReset, policy: HealthPolicy) -> Failure | None:
    """Why the reset of before's chip is not proven (ixsmi exited 0); None when the hardware shows it was."""
    why = await _not_back(monitor, before)
    if why is not None:
        return Failure(UNPROVEN, why)
    chip = next((chip for chip in monitor.view.inventory.chips() if chip.uuid == before.uuid), None)
    assert chip is not None  # _not_back found it
    again = monitor.reported_since(before.uuid, before.started)
    if again:
        xids = ", ".join(map(xid_name, sorted(again)))
        return Failure(STILL_UNHEALTHY, f"{xids} reported again after the reset: it was not cleared")
    rest = diagnose(replace(chip.status, xids=chip.status.xids - before.xids), policy)
    if not rest.healthy:
        return Failure(STILL_UNHEALTHY, f"still unhealthy after the reset: {', '.join(rest.reasons)}", cleared=True)
    return None


async def _not_back(monitor: HardwareMonitor, before: BeforeReset) -> str | None:
    """Why the chip is not back as it was (enumerated at its address, its XID events waited for); None if it is."""
    chip = next((chip for chip in monitor.view.inventory.chips() if chip.uuid == before.uuid), None)
    if chip is None or not chip.status.present:
        return "it was not enumerated again after the reset"
    if before.bus_id and chip.bus_id and chip.bus_id != before.bus_id:
        return f"it came back at PCI address {chip.bus_id}, not at {before.bus_id}"
    if before.xids_live:
        try:
            live = await monitor.xids_live(before.uuid)
        except BackendError as error:
            return f"whether its XID events are waited for again could not be told: {error}"
        if live is False:
            return "its XID events are not waited for again after the reset"
    return None


async def diagnostic_failure(command: tuple[str, ...], uuid: str, timeout: float) -> Failure | None:
    """Run the diagnostic for the chip (its arguments' {uuid} replaced); why it failed, None when it passed or
    none is configured."""
    if not command:
        return None
    from ix_device_plugin.hardware.ixml.reset import run_bounded

    argv = [arg.replace(UUID_FIELD, uuid) for arg in command]
    try:
        await asyncio.to_thread(run_bounded, argv, timeout)
    except BackendError as error:
        return Failure(DIAGNOSTIC_FAILED, f"the diagnostic failed: {error}")
    return None
