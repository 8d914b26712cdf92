"""The healer's reservations of chips for a reset, kept with the node-health record, so that they outlive it.

A chip about to be reset is first reserved: the node-health record says so (every pod of the agent reads it before
it gives out a chip) and the monitor holds it out of service, whatever its health reads, until the reset is done or
abandoned. The XIDs, each chip's story and the reservations are in the record (healing/record.py), which the pod
acting for the node writes and every other pod follows. A process reads it at start, before its first discovery, so
that a chip needing an operator is out of service from the first answer. The record equals what the acting pod
knows: a write that fails is tried again (with backoff) until it lands, and a record removed, spoiled or changed by
someone else is written again (healing/keeper.py). A pod on standby keeps the last good record it followed until
the acting pod writes one again, and takes over from it.

A reservation found in the record is a reset cut short (the agent stopped during it): the chip may be half reset,
so it stays reserved and is reset again before it is back in service, whatever its health reads meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ix_device_plugin.core.healing import HEALTHY, Care
from ix_device_plugin.core.healthrecord import ChipRecord, HealthRecord, Restored, chip_record, restore
from ix_device_plugin.hardware.monitor import HardwareMonitor, HardwareView
from ix_device_plugin.healing.keeper import RecordKeeper
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.healing.settings import HealingSettings
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.settings.health import HealthPolicy

log = logging.getLogger("ix_device_plugin.healing.healer")  # the healer's voice, whichever part of it speaks

RESERVED = "reserved for a GPU reset"


class Reservations:
    """The chips reserved for a reset and the node-health record, for one healer.

    cares: each chip's story, the healer's; the record restores them at start, on taking over and, on standby, from
    the acting pod's record. unreadable: says that the record cannot be used; wake: the healer's, set when what the
    record says changed.
    """

    def __init__(
        self,
        monitor: HardwareMonitor,
        record: RecordFile | None,
        cares: dict[str, Care],
        settings: HealingSettings,
        unreadable: Callable[[str], None],
        wake: asyncio.Event,
    ) -> None:
        self.monitor = monitor
        self.record = record
        self.cares = cares
        self.settings = settings
        self.reserved: dict[str, float] = {}  # chip UUID -> when (Unix time) it was reserved for a reset
        self.keeper = None if record is None else RecordKeeper(record, unreadable)
        self._wake = wake
        self._healing_now = ""  # the chip the healer resets (its reservation is the reset's to end)
        self._acted = False  # this process has taken over what the record says (it acts for the node)
        self._followed_reserved: frozenset[str] = frozenset()  # on standby: the chips the followed record reserves
        self.releasing: set[str] = set()  # reservations ended here, still held out until the record says so
        self.returns_seen: frozenset[str] | None = None  # the return annotation's chips, each asked for (None: unread)

    @property
    def acts(self) -> bool:
        """This process acts for the node, and has taken over what the record said."""
        return self.settings.acting() and self._acted

    @property
    def retry_at(self) -> float | None:
        """When (monotonic) a record write that failed is tried again; None: none is due."""
        return None if self.keeper is None else self.keeper.retry_at

    def restore(self, policy: HealthPolicy | None = None) -> None:
        """At start, before the monitor's first discovery: what the node-health record says, as another pod's
        knowledge (followed) until this process acts for the node: XIDs, reservations, each chip's story.
        policy: the health policy the start reads (default: the settings')."""
        if self.record is None:
            return
        restored = self._restored(self.record.read(), policy)
        self.monitor.preset(followed_xids=restored.xids, held_out={uuid: RESERVED for uuid in restored.reserved})
        self._followed_reserved = frozenset(restored.reserved)
        self.cares.update(restored.cares)
        for line in restored.forgotten:
            log.info("node-health record: the reboot cleared %s", line)
        out = [care for care in restored.cares.values() if care.phase != HEALTHY]  # the others: a reset history only
        if out:
            log.info("node-health record %s: %s", self.record.path,
                     "; ".join(f"{care.name}: {care.phase} ({care.note})" for care in out))  # fmt: skip

    async def follow_role(self) -> None:
        """Take over what the record says once this process acts for the node; on standby (again), leave it."""
        if self.settings.acting() and not self._acted:
            await self._take_over()
        elif not self.settings.acting() and self._acted:
            self._acted, self.reserved = False, {}  # on standby (again): the record is the acting pod's
            self.releasing.clear()

    def cut_short(self) -> set[str]:
        """The chips reserved by a reset that is not running: one cut short by a stop, found in the record."""
        if self.acts:
            return set(self.reserved) - {self._healing_now}
        return set(self._followed_reserved)

    def begin(self, uuid: str) -> bool:
        """The healer resets the chip now; whether its reservation ends with the reset (False: a reset cut short,
        whose reservation ends only once a reset of the chip is done)."""
        self._healing_now, ends = uuid, uuid not in self.reserved
        return ends

    def finish(self, uuid: str, ends: bool) -> None:
        """The healer's reset of the chip is over; ends: its reservation ends with it."""
        self._healing_now = ""
        if ends:
            self.unreserve(uuid)

    async def reserve(self, uuid: str) -> HardwareView:
        """Reserve the chip: in the record first (every pod reads it before it gives out a chip), then held out of
        service by the monitor; the view with the hold. OutputError when the record cannot say so."""
        before = self.reserved.get(uuid)
        self.reserved[uuid] = time.time()
        try:
            self.write(must=True)
        except OutputError:
            if before is None:
                del self.reserved[uuid]
            else:
                self.reserved[uuid] = before  # a reset cut short stays reserved
            raise
        return await self.monitor.hold_out(self._holds())

    def unreserve(self, uuid: str) -> None:
        """End the chip's reservation (nothing to wait for: a release needs no confirmation, and a stop may have
        ended the monitor's task already)."""
        if self.reserved.pop(uuid, None) is None:
            return
        self.releasing.add(uuid)
        self.write()
        self.release_once_written()

    def release_once_written(self) -> None:
        """Let the chips whose reservation ended back into service once the record no longer names them: every pod
        of the agent refuses a chip the record reserves, so a chip offered before (the write failed: a full disk)
        would be given by the kubelet and refused, and its pod failed for good. The keeper tries the write again."""
        if not self.releasing or self.retry_at is not None:
            return
        self.releasing.clear()
        self.monitor.ask_hold_out(self._holds())

    def _holds(self) -> dict[str, str]:
        """The chips the monitor holds out: those reserved, and those whose release the record does not say yet."""
        return {uuid: RESERVED for uuid in [*self.reserved, *self.releasing]}

    def end_reservations(self) -> None:
        """A chip reserved by a reset cut short (found in the record) stays reserved until a reset of it is done (the
        reset ends the reservation), even while it needs an operator (whose return resets it); or until it is gone."""
        if not self.acts:
            return  # the acting pod's to end
        for uuid in list(self.reserved):
            care = self.cares.get(uuid)
            if uuid != self._healing_now and (care is None or care.phase == HEALTHY):
                log.info("%s: released from the reservation of a reset cut short (%s)", uuid,
                         "no longer on the node" if care is None else care.note)  # fmt: skip
                self.unreserve(uuid)

    async def _take_over(self) -> None:
        """This process acts for the node from now on: what the record says now (or, when it is gone or spoiled,
        the last good record this process followed) becomes its own, and is written back."""
        record = self.record.known() if self.record is not None else None
        restored = self._restored(record)
        for uuid, care in restored.cares.items():
            self.cares.setdefault(uuid, care)
        await self.monitor.follow_xids(restored.xids)
        await self.monitor.adopt_followed()
        self.reserved = {uuid: time.time() for uuid in restored.reserved}
        await self.monitor.hold_out({u: RESERVED for u in self.reserved})
        if self.returns_seen is None and record is not None:
            self.returns_seen = record.returns_seen  # until this process reads the annotation itself
        self._acted = True
        if self.keeper is not None:
            self.keeper.write_anew()
        if record is not None:
            log.info("acting for the node: took over the node-health record %s (%d chips in it)",
                     self.record.path if self.record else "", len(record.chips))  # fmt: skip

    def _restored(self, record: HealthRecord | None, policy: HealthPolicy | None = None) -> Restored:
        if self.keeper is not None:
            self.keeper.say_unreadable()
        if record is None:
            return Restored()
        policy = policy or self.settings.policy()
        return restore(record, self.settings.boot_id, policy, wall_now=time.time(), mono_now=time.monotonic())

    async def follow(self) -> None:
        """Follow the record's file, until cancelled."""
        assert self.record is not None
        await self.record.follow(self._followed)

    async def _followed(self, record: HealthRecord | None) -> None:
        """The record's file changed. Acting for the node: write it again unless it holds what this process wrote.
        On standby: hold out and keep what the acting pod's record says, ready to take over; a record gone or
        spoiled changes nothing known (the acting pod writes it again)."""
        assert self.keeper is not None
        if self.acts:
            if self.keeper.check(record):
                self._wake.set()
            return
        self.keeper.say_unreadable()
        self.keeper.say_gone(record is None)
        if record is None:
            return
        restored = self._restored(record)
        self.cares.clear()  # the acting pod's stories, in place of those followed before
        self.cares.update(restored.cares)
        self._followed_reserved = frozenset(record.reserved())
        await self.monitor.follow_xids(restored.xids)
        await self.monitor.hold_out({uuid: RESERVED for uuid in record.reserved()})
        self._wake.set()

    def write(self, must: bool = False) -> None:
        """Write the record when what it says changed, or when the file no longer holds it (only the pod acting for
        the node writes it); must: raise OutputError when it cannot be written, else it is tried again until it is
        (RecordKeeper)."""
        if self.keeper is not None and self.acts:
            self.keeper.keep(self._record_now(), must)

    def _record_now(self) -> HealthRecord:
        """The record as this process knows the node now (written: 0, set when it is written)."""
        wall, mono, window = time.time(), time.monotonic(), self.settings.limit().window
        chips: dict[str, ChipRecord] = {}
        xids = {chip.uuid: chip.status.xids for chip in self.monitor.view.inventory.chips()}
        for uuid in sorted({*self.cares, *self.reserved, *(u for u, x in xids.items() if x)}):
            care = self.cares.get(uuid) or Care(uuid, self._minor(uuid))
            entry = chip_record(care, xids.get(uuid, frozenset()), RESERVED if uuid in self.reserved else "",
                                wall_now=wall, mono_now=mono, reserved_since=self.reserved.get(uuid),
                                window=window)  # fmt: skip
            if entry.worth_keeping:
                chips[uuid] = entry
        return HealthRecord(
            boot_id=self.settings.boot_id, writer=self.settings.writer, chips=chips, returns_seen=self.returns_seen
        )

    def returns_handled(self) -> frozenset[str] | None:
        """The chips the return annotation named, each asked for already: as this process read it, else as the
        node's record says (None: not known)."""
        if self.returns_seen is not None or self.record is None:
            return self.returns_seen
        record = self.record.known()
        return None if record is None else record.returns_seen

    def returns_read(self, named: frozenset[str]) -> None:
        """The annotation names these chips now, each new one asked for: the record says so (written when that
        changed)."""
        if named != self.returns_seen:
            self.returns_seen = named
            self.write()

    def _minor(self, uuid: str) -> int | None:
        chip = next((chip for chip in self.monitor.view.inventory.chips() if chip.uuid == uuid), None)
        return None if chip is None else chip.minor
