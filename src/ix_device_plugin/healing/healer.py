"""The healer: both front ends' node service that brings a broken chip back, and says so.

It follows the one hardware monitor. Each chip out of service gets a story (core/healing.py's `Care`): a chip whose
reasons a reset clears (the health policy says which) is reset once it is free, through the same `GpuReset` (ixsmi
and the handshake with the other IXML users) as `flags.reset_gpu` and claims with `reset: true`; then every chip's
health is read again (`HardwareMonitor.clear_xids`), and a healthy chip is back in service in both front ends, since
their state follows the monitor. Attempts are bounded (Rules.attempts, with a backoff); then the chip stays out and
needs an operator, who can ask for one more reset (`operator_return`).

The invariant: `ixsmi -r` runs for a chip only when no container holds it and none can be given it. In the node's
reset turn (the front end's ChipGuard), the chip is first reserved: the node-health record says so (every pod of
the agent reads it before it gives out a chip) and the monitor holds it out of service, whatever its health reads,
until the reset is done or abandoned. Only then is "free" asked, and it is asked again by GpuReset after the
handshake, still in the turn, immediately before ixsmi. A holder that cannot be known is a holder.

What the healer knows outlives it: the XIDs, each chip's story and the reservations are in the node-health record
(healing/record.py), which the pod acting for the node writes and every other pod follows. A process reads it at
start, before its first discovery, so that a chip needing an operator is out of service from the first answer.
The record equals what the acting pod knows: a write that fails is tried again (with backoff) until it lands, and a
record removed, spoiled or changed by someone else is written again. A pod on standby keeps the last good record
it followed until the acting pod writes one again, and takes over from it.

A reservation found in the record is a reset cut short (the agent stopped during it): the chip may be half reset,
so it stays reserved and is reset again before it is back in service, whatever its health reads meanwhile.

Every health change and step is a Node Event (NodeEvents), a metric and a line in the story file `list` shows.
One task (`run`) owns the stories; at most one reset runs at a time, in a task of its own, so that health changes
are still seen and said while a reset takes its time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from ix_device_plugin.core import healing as rules_of
from ix_device_plugin.core.healing import (
    HEALTHY,
    NEEDS_OPERATOR,
    OFF,
    OUT,
    RESETTING,
    WAITING,
    Care,
    Diagnosis,
    Rules,
    diagnose,
)
from ix_device_plugin.core.healthrecord import ChipRecord, HealthRecord, Restored, chip_record, restore
from ix_device_plugin.core.holding import UNKNOWN
from ix_device_plugin.core.inventory import Chip, Inventory
from ix_device_plugin.gpureset.sequence import GpuReset, GpuResetError
from ix_device_plugin.hardware.backend import XidEvent
from ix_device_plugin.hardware.monitor import HardwareMonitor, HardwareView
from ix_device_plugin.healing.events import NORMAL, WARNING, NodeEvents
from ix_device_plugin.healing.keeper import RecordKeeper
from ix_device_plugin.healing.metrics import HealingMetrics
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.healing.story import story_text
from ix_device_plugin.healing.wayback import RETURN_ANNOTATION
from ix_device_plugin.runtime.files import OutputError, write_atomically
from ix_device_plugin.runtime.lazymetrics import Registry
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.settings.health import HEALTH_POLICY, NOT_PRESENT, OPERATOR, HealthPolicy, xid_name

log = logging.getLogger(__name__)

FREE_POLL = 1.0  # seconds between looks at whether a waiting chip is free (and, on standby, at the node's role)
RESERVED = "reserved for a GPU reset"
_MEANINGS = {row.name: row.meaning for row in HEALTH_POLICY}


class ChipGuard(Protocol):
    """What a front end tells the healer: the node's reset turn, when a hold is served, and who holds a chip."""

    def turn(self) -> AbstractAsyncContextManager[None]:
        """The node-wide reset turn, shared by every pod of the agent (OutputError when it cannot be had in time)."""
        ...

    async def served(self, view: HardwareView) -> None:
        """Return once the front end serves view (its holds included) and an allocation answered before has had
        time to show in holder()."""
        ...

    async def holder(self, uuid: str) -> str | None:
        """Who holds the chip (a container, a claim, or why that cannot be known); None when no one does."""
        ...


class HeldError(GpuResetError):
    """The chip was found held at the last look before ixsmi: nothing was reset."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"held by {holder}", "refused")
        self.holder = holder


class Healer:
    """Resets broken chips once free and returns them to service; tells of every health change and step.

    policy and switch read the current configuration (the health policy, and health.selfHealing: auto, true,
    false); asks_others: a reset can ask the other IXML users to let go (the handshake, through the API server),
    which is what `auto` requires. events: where Node Events go (None: the log only); story: the story file.
    acting: whether this process acts for the node now (DRA: the pod holding the node's role; another pod on
    standby follows the chips but neither resets nor writes Events until it takes over).
    """

    def __init__(
        self,
        monitor: HardwareMonitor,
        reset: GpuReset,
        guard: ChipGuard,
        *,
        policy: Callable[[], HealthPolicy],
        switch: Callable[[], str],
        asks_others: bool,
        registry: Registry,
        events: NodeEvents | None = None,
        story: Path | None = None,
        node: str = "",
        rules: Rules | None = None,
        free_poll: float = FREE_POLL,
        acting: Callable[[], bool] = lambda: True,
        record: RecordFile | None = None,
        boot_id: str = "",
        writer: str = "",
    ) -> None:
        self.monitor = monitor
        self.reset = reset
        self.guard = guard
        self.policy = policy
        self.switch = switch
        self.asks_others = asks_others
        self.events = events
        self.story = story
        self.node = node
        self.rules = rules or Rules()
        self.free_poll = free_poll
        self.acting = acting
        self.record = record
        self.boot_id = boot_id
        self.writer = writer
        self.cares: dict[str, Care] = {}
        self.reserved: dict[str, float] = {}  # chip UUID -> when (Unix time) it was reserved for a reset
        self.releasing: set[str] = set()  # reservations ended here, still held out until the record says so
        self._healing_now = ""  # the chip _heal works on (its reservation is _heal's to end)
        self._acted = False  # this process has taken over what the record says (it acts for the node)
        self.keeper = None if record is None else RecordKeeper(record, self._say_unreadable)
        self._followed_reserved: frozenset[str] = frozenset()  # on standby: the chips the followed record reserves
        self.metrics = HealingMetrics(registry, self.phases)
        self._wake = asyncio.Event()
        self._work: asyncio.Task[None] | None = None
        self._story_written = ""
        self._story_errors = OncePerError(log, logging.WARNING)
        self._off_said = ""
        monitor.subscribe(lambda view: self._wake.set())
        monitor.listen_xids(self._xid)

    # ---- what others read and ask ---------------------------------------------------------------

    def phases(self) -> Mapping[str, int]:
        """Chips by phase, now; none in a pod on standby (the pod acting for the node counts them)."""
        counts: dict[str, int] = {}
        if not self.acting():
            return counts
        for care in self.cares.values():
            counts[care.phase] = counts.get(care.phase, 0) + 1
        return counts

    @property
    def healing(self) -> bool:
        """True while self-healing is on: `true`, or `auto` where a reset can ask the other IXML users to let go."""
        switch = self.switch()
        return switch == "true" or (switch == "auto" and self.asks_others)

    @property
    def resetting(self) -> bool:
        """True while a reset of the healer's runs."""
        return self._work is not None and not self._work.done()

    def wake(self) -> None:
        """Look again now: a chip may have been freed (a claim unprepared)."""
        for care in self.cares.values():
            if care.phase == WAITING and care.note.startswith("waiting to be reset: held by"):
                self.cares[care.uuid] = replace(care, retry_at=min(care.retry_at, time.monotonic()))
        self._wake.set()

    def operator_return(self, chip: str) -> bool:
        """An operator asked to return the chip (its UUID, or its index): one more reset; False when it names no chip
        that is out of service for good."""
        care = next((c for c in self.cares.values() if chip in (c.uuid, str(c.minor))), None)
        if care is None or care.phase not in (NEEDS_OPERATOR, OFF):
            log.info("an operator asked to return GPU %s, which is not waiting for one; nothing to do", chip)
            return False
        self._set(rules_of.operator_asked(care))
        self._event(NORMAL, "GPUReturnRequested", f"{care.name}: an operator asked to return it: one more reset")
        self._wake.set()
        return True

    # ---- the task ---------------------------------------------------------------------------------

    def restore(self, policy: HealthPolicy | None = None) -> None:
        """At start, before the monitor's first discovery: what the node-health record says, as another pod's
        knowledge (followed) until this process acts for the node: XIDs, reservations, each chip's story.
        policy: the health policy the start reads (default: the healer's)."""
        if self.record is None:
            return
        restored = self._restored(self.record.read(), policy)
        self.monitor.preset(followed_xids=restored.xids, held_out={uuid: RESERVED for uuid in restored.reserved})
        self._followed_reserved = frozenset(restored.reserved)
        self.cares.update(restored.cares)
        for line in restored.forgotten:
            log.info("node-health record: the reboot cleared %s", line)
        if restored.cares:
            log.info(
                "node-health record %s: %s", self.record.path,
                "; ".join(f"{care.name}: {care.phase} ({care.note})" for care in restored.cares.values()),
            )  # fmt: skip

    async def run(self) -> None:
        """Follow the monitor and heal, until cancelled (a reset under way is left to GpuReset.close)."""
        follow = asyncio.create_task(self._follow_record(), name="node-health-follow") if self.record else None
        try:
            while True:
                self._wake.clear()
                if self.acting() and not self._acted:
                    await self._take_over()
                elif not self.acting() and self._acted:
                    self._acted, self.reserved = False, {}  # on standby (again): the record is the acting pod's
                    self.releasing.clear()
                self._look(self.monitor.view)
                self._end_reservations()
                self._start_due()
                self._write_story()
                self._write_record()
                self._release_once_written()
                await self._sleep()
        finally:
            if follow is not None:
                follow.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follow
            if self._work is not None:
                self._work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._work

    async def _sleep(self) -> None:
        wait = self._next_wake()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._wake.wait()

    def _next_wake(self) -> float | None:
        """Seconds until a waiting chip is due (or looked at again for being free), or a record write that failed
        is tried again; None: only news wakes."""
        now = time.monotonic()
        if not self.acting() or not self._acted:
            return self.free_poll  # on standby: look again for taking over
        retry_at = None if self.keeper is None else self.keeper.retry_at
        waits = [] if retry_at is None else [max(0.0, retry_at - now)]
        waiting = [care for care in self.cares.values() if care.phase == WAITING]
        if waiting and not self.resetting:
            waits.append(max(0.0, min(max(care.retry_at - now, 0.0) or self.free_poll for care in waiting)))
        return min(waits, default=None)

    # ---- seeing ---------------------------------------------------------------------------------

    def _look(self, view: HardwareView) -> None:
        """Take the monitor's view: each chip's story follows its health."""
        if not view.discovered:
            return
        policy, healing, now = self.policy(), self.healing, time.monotonic()
        self._say_whether_off(healing)
        chips = {chip.uuid: chip for chip in view.inventory.chips()}
        for uuid in [uuid for uuid in self.cares if uuid not in chips]:
            del self.cares[uuid]  # unplugged: nothing left to heal
        cut_short = self._cut_short()
        for uuid, chip in chips.items():
            care = self.cares.get(uuid) or Care(uuid, chip.minor)
            diagnosis = diagnose(chip.status, policy)
            self._set(rules_of.observe(care, diagnosis, now, self.rules, healing, cut_short=uuid in cut_short))

    def _cut_short(self) -> set[str]:
        """The chips reserved by a reset that is not running: one cut short by a stop, found in the record."""
        if self.acting() and self._acted:
            return set(self.reserved) - {self._healing_now}
        return set(self._followed_reserved)

    def _say_whether_off(self, healing: bool) -> None:
        why = ""
        if not healing:
            why = (
                "health.selfHealing is false"
                if self.switch() == "false"
                else "no API access to ask the other IXML users (ix-exporter) to let go first; "
                "health.selfHealing: true resets without asking"
            )
        if why != self._off_said:
            if why:
                log.info("self-healing is off (%s): chips a reset could fix stay out of service", why)
            else:
                log.info("self-healing is on: a chip a reset can fix is reset once no container holds it")
            self._off_said = why

    def _xid(self, event: XidEvent) -> None:
        """An XID event on a served chip (from the monitor): a Node Event, unless the policy ignores it.

        A chip's XIDs are one Event per action (a reset clears them; they need an operator) naming the latest, not
        one per XID number: a chip reporting thousands of numbers costs as few API writes as a storm of one, while an
        XID that needs an operator is never hidden behind a storm of those a reset clears."""
        policy, name = self.policy(), xid_name(event.xid)
        if policy.ignores(name):
            return
        chip = self._chip(event.uuid)
        care = self.cares.get(event.uuid) or Care(event.uuid, None if chip is None else chip.minor)
        meaning = _MEANINGS.get(name)
        action = policy.action(name)
        what = "needs an operator" if action == OPERATOR else "a reset clears it"
        if self.events is not None and self.acting():
            message = f"{care.name}: {name}{f' ({meaning})' if meaning else ''}: {what}"
            self.events.record(WARNING, "GPUXidError", message, key=f"{event.uuid} {action}")

    # ---- resetting ----------------------------------------------------------------------------

    def _start_due(self) -> None:
        if self.resetting or not self.acting():
            return
        now = time.monotonic()
        due = [care for care in self.cares.values() if rules_of.due(care, now)]
        if due:
            care = min(due, key=lambda care: (care.retry_at, care.minor or 0))
            self._work = asyncio.create_task(self._heal(care), name=f"heal-{care.uuid}")
            self._work.add_done_callback(self._healed)

    def _healed(self, work: asyncio.Task[None]) -> None:
        if not work.cancelled() and (error := work.exception()) is not None:
            log.error("healing stopped by %s: %s", type(error).__name__, error)
        self._wake.set()

    async def _heal(self, care: Care) -> None:
        """In the node's reset turn: reserve care's chip, then reset it if it is free, then read every chip's health
        again; the reservation ends with the reset (or with finding the chip held).

        A stop in the middle of the reset keeps the turn until ixsmi is over (GpuReset.close bounds it) and leaves the
        reservation in the record: the next pod to act finds the reset cut short and does it again. The reservation
        of a reset cut short ends only once a reset of the chip is done: found held, or a reset that failed, it stays.
        """
        uuid = care.uuid
        try:
            async with self.guard.turn():
                care = self.cares.get(uuid) or care
                if not rules_of.due(care, time.monotonic()) or not self.acting():
                    return  # it came back by itself, or went to an operator, or another pod acts now
                self._healing_now, ends = uuid, uuid not in self.reserved  # reserved already: a reset cut short
                try:
                    # Held now: wait without reserving it. A reservation found held is ended at once, and each costs
                    # a record write and two publications of the chip (its slices read, or the plugin's devices sent),
                    # at every look for as long as a container holds the chip. Free now: reserved, then looked at again.
                    if (holder := await self.guard.holder(uuid)) is not None:
                        self._wait_for(care, holder)
                        return
                    await self.guard.served(await self._reserve(uuid))
                    holder = await self.guard.holder(uuid)
                    if holder is not None:
                        self._wait_for(care, holder)
                        return
                    try:
                        ends = await self._reset(care) or ends
                    except asyncio.CancelledError:
                        ends = False
                        await self.reset.settled()
                        raise
                finally:
                    self._healing_now = ""
                    if ends:
                        self._unreserve(uuid)
        except OutputError as error:  # the turn or the record: nothing was reset
            self._set(rules_of.refused(self.cares.get(uuid) or care, str(error), time.monotonic(), self.rules))

    def _wait_for(self, care: Care, holder: str) -> None:
        waiting = rules_of.held(care, holder, time.monotonic() + self.free_poll)
        if waiting.note != care.note:
            why = holder if holder.startswith(UNKNOWN) else f"held by {holder}"  # unknown counts as held
            self._event(NORMAL, "GPUHealingWaiting", f"{care.name} waits to be reset: {why}")
        self._set(waiting)

    async def _still_free(self, uuid: str) -> None:
        """GpuReset's last look, after the handshake and immediately before ixsmi: the chip is still reserved by
        this process, which still acts for the node, and no one holds it; else GpuResetError (nothing reset)."""
        if not self.acting():
            raise GpuResetError("this pod no longer acts for the node; the GPU was not reset", "refused")
        if uuid not in self.reserved:
            raise GpuResetError(f"{uuid} is no longer reserved for the reset; the GPU was not reset", "refused")
        holder = await self.guard.holder(uuid)
        if holder is not None:
            raise HeldError(holder)

    async def _reset(self, care: Care) -> bool:
        """Reset care's chip and read its health again; True once ixsmi has reset it."""
        chip = self._chip(care.uuid)
        xids = frozenset() if chip is None else chip.status.xids
        care = rules_of.started(care)
        self._set(care)
        what = f"for {', '.join(care.causes)}" if care.causes else ""
        self._event(NORMAL, "GPUHealingReset", f"{care.name}: resetting it {what} (attempt {care.attempts})")
        log.info("healing %s: resetting it %s (attempt %d)", care.name, what, care.attempts)
        try:
            await self.reset.reset([care.uuid], check=lambda: self._still_free(care.uuid))
        except HeldError as held:
            self.metrics.resets.labels(result="refused").inc()
            log.warning("healing %s: not reset: held by %s since it was found free", care.name, held.holder)
            self._wait_for(replace(care, attempts=care.attempts - 1, phase=WAITING), held.holder)
            return False
        except GpuResetError as error:
            self._reset_failed(care, error)
            return False
        view = await self.monitor.clear_xids(care.uuid, xids)
        after = self._diagnosis(view.inventory, care.uuid)
        self.metrics.resets.labels(result="ok" if after.healthy else "still_unhealthy").inc()
        done = rules_of.reset_done(care, after, time.monotonic(), self.rules)
        if done.phase != HEALTHY:
            self._event(WARNING, "GPUHealingFailed", f"{care.name}: {done.note}")
        self._set(done)
        return True

    def _reset_failed(self, care: Care, error: GpuResetError) -> None:
        now = time.monotonic()
        if error.result == "refused":
            self.metrics.resets.labels(result="refused").inc()
            after = rules_of.refused(care, str(error), now, self.rules)
        else:
            self.metrics.resets.labels(result="failed").inc()
            after = rules_of.failed(care, str(error), now, self.rules)
        self._event(WARNING, "GPUHealingFailed", f"{care.name}: {after.note}")
        log.warning("healing %s: %s", care.name, after.note)
        self._set(after)

    def _diagnosis(self, inventory: Inventory, uuid: str) -> Diagnosis:
        chip = next((chip for chip in inventory.chips() if chip.uuid == uuid), None)
        if chip is None:  # it came back under another UUID, or not at all
            return Diagnosis(operator=(NOT_PRESENT,))
        return diagnose(chip.status, self.policy())

    # ---- reservations and the node-health record ----------------------------------------------------

    async def _reserve(self, uuid: str) -> HardwareView:
        """Reserve the chip: in the record first (every pod reads it before it gives out a chip), then held out of
        service by the monitor; the view with the hold. OutputError when the record cannot say so."""
        before = self.reserved.get(uuid)
        self.reserved[uuid] = time.time()
        try:
            self._write_record(must=True)
        except OutputError:
            if before is None:
                del self.reserved[uuid]
            else:
                self.reserved[uuid] = before  # a reset cut short stays reserved
            raise
        return await self.monitor.hold_out(self._holds())

    def _unreserve(self, uuid: str) -> None:
        """End the chip's reservation (nothing to wait for: a release needs no confirmation, and a stop may have
        ended the monitor's task already)."""
        if self.reserved.pop(uuid, None) is None:
            return
        self.releasing.add(uuid)
        self._write_record()
        self._release_once_written()

    def _release_once_written(self) -> None:
        """Let the chips whose reservation ended back into service once the record no longer names them: every pod
        of the agent refuses a chip the record reserves, so a chip offered before (the write failed: a full disk)
        would be given by the kubelet and refused, and its pod failed for good. The keeper tries the write again."""
        if not self.releasing or (self.keeper is not None and self.keeper.retry_at is not None):
            return
        self.releasing.clear()
        self.monitor.ask_hold_out(self._holds())

    def _holds(self) -> dict[str, str]:
        """The chips the monitor holds out: those reserved, and those whose release the record does not say yet."""
        return {uuid: RESERVED for uuid in [*self.reserved, *self.releasing]}

    def _end_reservations(self) -> None:
        """A chip reserved by a reset cut short (found in the record) stays reserved until a reset of it is done (the
        reset ends the reservation), even while it needs an operator (whose return resets it); or until it is gone."""
        if not self.acting() or not self._acted:
            return  # the acting pod's to end
        for uuid in list(self.reserved):
            care = self.cares.get(uuid)
            if uuid != self._healing_now and (care is None or care.phase == HEALTHY):
                log.info("%s: released from the reservation of a reset cut short (%s)", uuid,
                         "no longer on the node" if care is None else care.note)  # fmt: skip
                self._unreserve(uuid)

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
        await self.monitor.hold_out(self._holds())
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
        policy = policy or self.policy()
        return restore(record, self.boot_id, policy, wall_now=time.time(), mono_now=time.monotonic())

    async def _follow_record(self) -> None:
        assert self.record is not None
        await self.record.follow(self._followed)

    async def _followed(self, record: HealthRecord | None) -> None:
        """The record's file changed. Acting for the node: write it again unless it holds what this process wrote.
        On standby: hold out and keep what the acting pod's record says, ready to take over; a record gone or
        spoiled changes nothing known (the acting pod writes it again)."""
        assert self.keeper is not None
        if self.acting() and self._acted:
            if self.keeper.check(record):
                self._wake.set()
            return
        self.keeper.say_unreadable()
        self.keeper.say_gone(record is None)
        if record is None:
            return
        restored = self._restored(record)
        self.cares = dict(restored.cares)
        self._followed_reserved = frozenset(record.reserved())
        await self.monitor.follow_xids(restored.xids)
        await self.monitor.hold_out({uuid: RESERVED for uuid in record.reserved()})
        self._wake.set()

    def _say_unreadable(self, why: str) -> None:
        self._event(WARNING, "GPUHealthRecordUnreadable", why)

    def _write_record(self, must: bool = False) -> None:
        """Write the record when what it says changed, or when the file no longer holds it (only the pod acting for
        the node writes it); must: raise OutputError when it cannot be written, else it is tried again until it is
        (RecordKeeper)."""
        if self.keeper is not None and self.acting() and self._acted:
            self.keeper.keep(self._record_now(), must)

    def _record_now(self) -> HealthRecord:
        """The record as this process knows the node now (written: 0, set when it is written)."""
        wall, mono = time.time(), time.monotonic()
        chips: dict[str, ChipRecord] = {}
        xids = {chip.uuid: chip.status.xids for chip in self.monitor.view.inventory.chips()}
        for uuid in sorted({*self.cares, *self.reserved, *(u for u, x in xids.items() if x)}):
            care = self.cares.get(uuid) or Care(uuid, self._minor(uuid))
            entry = chip_record(care, xids.get(uuid, frozenset()), RESERVED if uuid in self.reserved else "",
                                wall_now=wall, mono_now=mono, reserved_since=self.reserved.get(uuid))  # fmt: skip
            if entry.worth_keeping:
                chips[uuid] = entry
        return HealthRecord(boot_id=self.boot_id, writer=self.writer, chips=chips)

    def _minor(self, uuid: str) -> int | None:
        chip = self._chip(uuid)
        return None if chip is None else chip.minor

    # ---- telling ----------------------------------------------------------------------------

    def _set(self, care: Care) -> None:
        """care is the chip's story now: tell of its health changes (Events, logs, metrics)."""
        before = self.cares.get(care.uuid) or Care(care.uuid, care.minor)
        self.cares[care.uuid] = care
        if before.phase == care.phase:
            return
        if before.phase == HEALTHY:
            said = f"{care.name} is out of service: {', '.join(care.causes)}; {_remedy(care.phase)}"
            self._event(WARNING, "GPUUnhealthy", said)
            log.warning("%s", said)
        if care.phase == HEALTHY:
            self._back(before, care)
        elif care.phase == NEEDS_OPERATOR:
            self.metrics.outcomes.labels(outcome="needs_operator").inc()
            how = f"kubectl annotate --overwrite node {self.node or '<node>'} {RETURN_ANNOTATION}={care.uuid}"
            self._event(WARNING, "GPUNeedsOperator", f"{care.name} {care.note}; once it is fixed, return it: {how}")
            log.warning("%s %s", care.name, care.note)

    def _back(self, before: Care, care: Care) -> None:
        out = None if before.out_since is None else time.monotonic() - before.out_since
        if out is not None:
            self.metrics.out_of_service.observe(out)
        healed = before.phase == RESETTING
        if healed:
            self.metrics.outcomes.labels(outcome="healed").inc()
        how = "after a reset" if healed else "the problem cleared"
        took = "" if out is None else f" after {out:.1f}s out of service"
        self._event(NORMAL, "GPUHealthy", f"{care.name} is back in service{took}: {how}")
        log.info("%s is back in service%s: %s", care.name, took, how)

    def _event(self, type: str, reason: str, message: str) -> None:
        if self.events is not None and self.acting():
            self.events.record(type, reason, message)

    def _write_story(self) -> None:
        if self.story is None or not self.acting():
            return  # a pod on standby leaves the story to the one acting
        healing = "on" if self.healing else f"off ({self._off_said})"
        key = repr((healing, sorted((c.uuid, c.phase, c.causes, c.attempts, c.note) for c in self.cares.values())))
        if (key == self._story_written and self.story.exists()) or not self.story.parent.parent.is_dir():
            return  # unchanged; or the front end's directory is gone (it is not ours to make)
        try:
            write_atomically(self.story, story_text(self.cares.values(), healing, time.monotonic()))
        except OutputError as error:
            self._story_errors.failed("health story: %s", error)
            return
        self._story_errors.succeeded()
        self._story_written = key

    def _chip(self, uuid: str) -> Chip | None:
        return next((chip for chip in self.monitor.view.inventory.chips() if chip.uuid == uuid), None)


def _remedy(phase: str) -> str:
    return {
        WAITING: "it is reset once no workload holds it",
        NEEDS_OPERATOR: "it needs an operator",
        OUT: "it returns when the problem clears",
        OFF: "self-healing is off: it stays out of service",
        RESETTING: "it is being reset",
    }.get(phase, "")
