"""The healer sees each chip's health and resets a broken one once it is free, to bring it back into service.

Both front ends' node service; it leaves the reservations with the record (healing/reservations.py) and the telling
(healing/telling.py) to its parts.

It follows the one hardware monitor. Each chip out of service gets a story (core/healing.py's `Care`): a chip whose
reasons a reset clears (the health policy says which) is reset once it is free, through the same `GpuReset` (ixsmi
and the handshake with the other IXML users) as `flags.reset_gpu` and claims with `reset: true`; then every chip's
health is read again (`HardwareMonitor.clear_xids`), and a healthy chip is back in service in both front ends, since
their state follows the monitor. Attempts are bounded (Rules.attempts, with a backoff); then the chip stays out and
needs an operator, who can ask for one more reset (`operator_return`).

The invariant: `ixsmi -r` runs for a chip only when no container holds it and none can be given it. In the node's
reset turn (the front end's ChipGuard), the chip is first reserved (Reservations: the record says so and the monitor
holds it out of service). Only then is "free" asked, and it is asked again by GpuReset after the handshake, still in
the turn, immediately before ixsmi. A holder that cannot be known is a holder.

One task (`run`) owns the stories; at most one reset runs at a time, in a task of its own, so that health changes
are still seen and said while a reset takes its time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from ix_device_plugin.core import healing as rules_of
from ix_device_plugin.core.healing import HEALTHY, NEEDS_OPERATOR, OFF, WAITING, Care, Diagnosis, diagnose
from ix_device_plugin.core.holding import UNKNOWN
from ix_device_plugin.core.inventory import Chip, Inventory
from ix_device_plugin.gpureset.outcome import UNAVAILABLE, GpuResetError
from ix_device_plugin.hardware.monitor import HardwareMonitor, HardwareView
from ix_device_plugin.healing.proof import PROOF_RESULTS, before_reset, diagnostic_failure, unproven
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.healing.reservations import Reservations
from ix_device_plugin.healing.settings import HealingSettings
from ix_device_plugin.healing.telling import NORMAL, WARNING, Telling
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.lazymetrics import Registry
from ix_device_plugin.settings.health import NOT_PRESENT, HealthPolicy

if TYPE_CHECKING:
    from ix_device_plugin.gpureset.service import ResetService
    from ix_device_plugin.healing.events import NodeEvents

log = logging.getLogger(__name__)


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

    events: the Node's Events, there when the API server is at hand, through which a reset can also ask the other
    IXML users to let go (the handshake), which `auto` requires; None: the log only, and no asking. record: the
    node-health record's file (None: none kept).
    """

    def __init__(
        self,
        monitor: HardwareMonitor,
        reset: ResetService,
        guard: ChipGuard,
        settings: HealingSettings,
        *,
        registry: Registry,
        events: NodeEvents | None = None,
        record: RecordFile | None = None,
    ) -> None:
        self.monitor = monitor
        self.reset = reset
        self.guard = guard
        self.settings = settings
        self.asks_others = events is not None
        self.cares: dict[str, Care] = {}  # each chip's story, by UUID: this healer's, restored by the record
        self._wake = asyncio.Event()
        self._work: asyncio.Task[None] | None = None
        self.telling = Telling(monitor, self.cares, settings, events, registry)
        self.metrics = self.telling.metrics
        unreadable = self.telling.record_unreadable
        self.reservations = Reservations(monitor, record, self.cares, settings, unreadable, self._wake)
        monitor.subscribe(lambda view: self._wake.set())
        monitor.listen_xids(self.telling.xid)

    # ---- what others read and ask ---------------------------------------------------------------

    @property
    def reserved(self) -> dict[str, float]:
        """The chips reserved for a reset: UUID -> when (Unix time)."""
        return self.reservations.reserved

    @property
    def healing(self) -> bool:
        """True while self-healing is on: `true`, or `auto` where a reset can ask the other IXML users to let go."""
        switch = self.settings.switch()
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

    def settings_changed(self) -> None:
        """The configuration was reloaded: look at every chip again now, as at news of the chips. A chip left out of
        service while self-healing was off waits for its reset once it is on (the same guards as always: the
        holder, the node's reset turn, the role); the health policy's changes are seen at once too."""
        self._wake.set()

    def operator_return(self, chip: str) -> bool:
        """An operator asked to return the chip (its UUID, or its index): one more reset; False when it names no chip
        that is out of service for good."""
        care = next((c for c in self.cares.values() if chip in (c.uuid, str(c.minor))), None)
        if care is None or care.phase not in (NEEDS_OPERATOR, OFF):
            log.info("an operator asked to return GPU %s, which is not waiting for one; nothing to do", chip)
            return False
        what = (
            "its health is read again (reset by hand: no reset can work here)"
            if rules_of.left_unreset(care)
            else ("one more reset")
        )
        self._set(rules_of.operator_asked(care))
        self.telling.event(NORMAL, "GPUReturnRequested", f"{care.name}: an operator asked to return it: {what}")
        self._wake.set()
        return True

    def returns_handled(self) -> frozenset[str] | None:
        """The chips the operator's return annotation named, each asked for already (None: not known)."""
        return self.reservations.returns_handled()

    def returns_read(self, named: frozenset[str]) -> None:
        """The annotation names these chips now, each new one asked for: the record says so."""
        self.reservations.returns_read(named)

    # ---- the task ---------------------------------------------------------------------------------

    def restore(self, policy: HealthPolicy | None = None) -> None:
        """At start, before the monitor's first discovery: what the node-health record says (Reservations.restore).
        policy: the health policy the start reads (default: the settings')."""
        self.reservations.restore(policy)

    async def run(self) -> None:
        """Follow the monitor and heal, until cancelled (a reset under way is left to GpuReset.close)."""
        reservations = self.reservations
        follow = asyncio.create_task(reservations.follow(), name="node-health-follow") if reservations.record else None
        try:
            while True:
                self._wake.clear()
                acted = reservations.acts
                await reservations.follow_role()
                if reservations.acts and not acted:
                    self.telling.still_waiting(list(self.cares.values()))
                self._look(self.monitor.view)
                reservations.end_reservations()
                self._start_due()
                self.telling.write_story(self.healing)
                reservations.write()
                reservations.release_once_written()
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
        if not self.reservations.acts:
            return self.settings.free_poll  # on standby: look again for taking over
        retry_at = self.reservations.retry_at
        waits = [] if retry_at is None else [max(0.0, retry_at - now)]
        waiting = [care for care in self.cares.values() if care.phase == WAITING]
        if waiting and not self.resetting:
            waits.append(max(0.0, min(max(care.retry_at - now, 0.0) or self.settings.free_poll for care in waiting)))
        return min(waits, default=None)

    # ---- seeing ---------------------------------------------------------------------------------

    def _look(self, view: HardwareView) -> None:
        """Take the monitor's view: each chip's story follows its health."""
        if not view.discovered:
            return
        policy, healing, now = self.settings.policy(), self.healing, time.monotonic()
        self.telling.say_whether_off(healing)
        chips = {chip.uuid: chip for chip in view.inventory.chips()}
        for uuid in [uuid for uuid in self.cares if uuid not in chips]:
            del self.cares[uuid]  # unplugged: nothing left to heal
        cut_short = self.reservations.cut_short()
        rules, limit, wall = self.settings.rules, self.settings.limit(), time.time()
        for uuid, chip in chips.items():
            care = self.cares.get(uuid) or Care(uuid, chip.minor)
            diagnosis = diagnose(chip.status, policy)
            self._set(rules_of.observe(care, diagnosis, now, rules, healing, cut_short=uuid in cut_short,
                                       limit=limit, wall_now=wall))  # fmt: skip

    def _set(self, care: Care) -> None:
        """care is the chip's story now: told of when its phase changed, and shown where the chip is published."""
        before = self.cares.get(care.uuid) or Care(care.uuid, care.minor)
        self.cares[care.uuid] = care
        self.telling.changed(before, care)
        if rules_of.shown(before) != rules_of.shown(care):
            self.monitor.show_care({uuid: word for uuid, c in self.cares.items() if (word := rules_of.shown(c))})

    # ---- resetting ----------------------------------------------------------------------------

    def _start_due(self) -> None:
        if self.resetting or not self.settings.acting():
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
                if not rules_of.due(care, time.monotonic()) or not self.settings.acting():
                    return  # it came back by itself, or went to an operator, or another pod acts now
                if (problem := await self.reset.problem()) is not None:  # no reset can work: none is tried
                    await self._unresettable(care, problem)
                    return
                ends = self.reservations.begin(uuid)  # False: reserved already, a reset cut short
                try:
                    # Held now: wait without reserving it. A reservation found held is ended at once, and each costs
                    # a record write and two publications of the chip (its slices read, or the plugin's devices sent),
                    # at every look for as long as a container holds the chip. Free now: reserved, then looked at again.
                    if (holder := await self.guard.holder(uuid)) is not None:
                        self._wait_for(care, holder)
                        return
                    await self.guard.served(await self.reservations.reserve(uuid))
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
                    self.reservations.finish(uuid, ends)
        except OutputError as error:  # the turn or the record: nothing was reset
            self._set(rules_of.refused(self.cares.get(uuid) or care, str(error), time.monotonic(), self.settings.rules))

    async def _unresettable(self, care: Care, problem: str) -> None:
        """No reset can work here: the chip waits for an operator (one Event naming what is missing, said by the
        telling). An operator's return means they reset it by hand: its health is read again, without ixsmi."""
        if not care.operator_return:
            self._set(rules_of.unavailable(care, problem))
            return
        chip = self._chip(care.uuid)
        view = await self.monitor.clear_xids(care.uuid, frozenset() if chip is None else chip.status.xids)
        self._set(rules_of.returned_by_hand(care, self._diagnosis(view.inventory, care.uuid)))

    def _wait_for(self, care: Care, holder: str) -> None:
        waiting = rules_of.held(care, holder, time.monotonic() + self.settings.free_poll)
        if waiting.note != care.note:
            why = holder if holder.startswith(UNKNOWN) else f"held by {holder}"  # unknown counts as held
            self.telling.event(NORMAL, "GPUHealingWaiting", f"{care.name} waits to be reset: {why}")
        self._set(waiting)

    async def _still_free(self, uuid: str) -> None:
        """GpuReset's last look, after the handshake and immediately before ixsmi: the chip is still reserved by
        this process, which still acts for the node, and no one holds it; else GpuResetError (nothing reset)."""
        if not self.settings.acting():
            raise GpuResetError("this pod no longer acts for the node; the GPU was not reset", "refused")
        if uuid not in self.reservations.reserved:
            raise GpuResetError(f"{uuid} is no longer reserved for the reset; the GPU was not reset", "refused")
        holder = await self.guard.holder(uuid)
        if holder is not None:
            raise HeldError(holder)

    async def _reset(self, care: Care) -> bool:
        """Reset care's chip and read its health again; True once ixsmi has reset it. The last look first: an
        error that needs an operator (an XID of that class) seen since the reset was decided, or since the operator
        asked to return the chip, stops it, else the reset would clear that XID with the ones it was for."""
        news = self._diagnosis(self.monitor.view.inventory, care.uuid)
        if late := rules_of.not_returned(care, news):
            self._set(rules_of.returned_too_early(care, late))
            return False
        if news.operator and not care.operator_return:
            self._set(rules_of.observe(care, news, time.monotonic(), self.settings.rules, self.healing))
            return False
        before = await before_reset(self.monitor, self._chip(care.uuid), care.uuid)
        care = rules_of.started(care, time.time())
        self._set(care)
        what = f"for {', '.join(care.causes)}" if care.causes else ""
        self.telling.event(NORMAL, "GPUHealingReset", f"{care.name}: resetting it {what} (attempt {care.attempts})")
        log.info("healing %s: resetting it %s (attempt %d)", care.name, what, care.attempts)
        try:
            await self.reset.reset([care.uuid], check=lambda: self._still_free(care.uuid))
        except HeldError as held:
            self.metrics.resets.labels(result="refused").inc()
            log.warning("healing %s: not reset: held by %s since it was found free", care.name, held.holder)
            self._wait_for(rules_of.taken_back(care), held.holder)
            return False
        except GpuResetError as error:
            self._reset_failed(care, error)
            return False
        config, policy = self.settings.config(), self.settings.policy()
        failure = await unproven(self.monitor, before, policy) or await diagnostic_failure(
            config.reset_diagnostic, care.uuid, config.reset_diagnostic_timeout
        )
        if failure is not None:  # ixsmi exited 0, but the hardware does not show a reset: a failed attempt
            if failure.cleared:
                await self.monitor.clear_xids(care.uuid, before.xids, before=before.started)
            self._reset_failed(care, GpuResetError(failure.why, failure.result))
            return True
        view = await self.monitor.clear_xids(care.uuid, before.xids, before=before.started)
        after = self._diagnosis(view.inventory, care.uuid)
        self.metrics.resets.labels(result="ok" if after.healthy else "still_unhealthy").inc()
        done = rules_of.reset_done(care, after, time.monotonic(), self.settings.rules)
        if done.phase != HEALTHY:
            self.telling.event(WARNING, "GPUHealingFailed", f"{care.name}: {done.note}")
        self._set(done)
        return True

    def _reset_failed(self, care: Care, error: GpuResetError) -> None:
        now = time.monotonic()
        if error.result == UNAVAILABLE:  # found at the reset's first step (the configuration changed since)
            self.metrics.resets.labels(result=UNAVAILABLE).inc()
            self._set(rules_of.unavailable(replace(care, attempts=max(0, care.attempts - 1)), str(error)))
            return
        if error.result == "refused":
            self.metrics.resets.labels(result="refused").inc()
            after = rules_of.refused(care, str(error), now, self.settings.rules)
        else:
            self.metrics.resets.labels(result=error.result if error.result in PROOF_RESULTS else "failed").inc()
            after = rules_of.failed(care, str(error), now, self.settings.rules)
        self.telling.event(WARNING, "GPUHealingFailed", f"{care.name}: {after.note}")
        log.warning("healing %s: %s", care.name, after.note)
        self._set(after)

    def _diagnosis(self, inventory: Inventory, uuid: str) -> Diagnosis:
        chip = next((chip for chip in inventory.chips() if chip.uuid == uuid), None)
        if chip is None:  # it came back under another UUID, or not at all
            return Diagnosis(operator=(NOT_PRESENT,))
        return diagnose(chip.status, self.settings.policy())

    def _chip(self, uuid: str) -> Chip | None:
        return next((chip for chip in self.monitor.view.inventory.chips() if chip.uuid == uuid), None)
