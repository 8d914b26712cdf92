"""The healer: both front ends' node service that brings a broken chip back, and says so.

It follows the one hardware monitor. Each chip out of service gets a story (core/healing.py's `Care`): a chip whose
reasons a reset clears (the health policy says which) is reset once it is free, through the same `GpuReset` (ixsmi
and the handshake with the other IXML users) as `flags.reset_gpu` and claims with `reset: true`; then every chip's
health is read again (`HardwareMonitor.clear_xids`), and a healthy chip is back in service in both front ends, since
their state follows the monitor. A chip still in use waits; the front end's guard tells whether it is free and keeps
new allocations off it while it is reset. Attempts are bounded (Rules.attempts, with a backoff); then the chip stays
out and needs an operator, who can ask for one more reset (`operator_return`).

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
from ix_device_plugin.core.inventory import Chip, Inventory
from ix_device_plugin.gpureset.sequence import GpuReset, GpuResetError
from ix_device_plugin.hardware.backend import XidEvent
from ix_device_plugin.hardware.monitor import HardwareMonitor, HardwareView
from ix_device_plugin.healing.events import NORMAL, WARNING, NodeEvents
from ix_device_plugin.healing.metrics import HealingMetrics
from ix_device_plugin.healing.story import story_text
from ix_device_plugin.healing.wayback import RETURN_ANNOTATION
from ix_device_plugin.runtime.files import OutputError, write_atomically
from ix_device_plugin.runtime.lazymetrics import Registry
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.settings.health import HEALTH_POLICY, NOT_PRESENT, OPERATOR, HealthPolicy, xid_name

log = logging.getLogger(__name__)

FREE_POLL = 1.0  # seconds between looks at whether a waiting chip is free
# The front end's guard for a chip: yields who holds it (None: free, and kept free until the context ends).
Guard = Callable[[str], AbstractAsyncContextManager[str | None]]
_MEANINGS = {row.name: row.meaning for row in HEALTH_POLICY}


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
        guard: Guard,
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
        self.cares: dict[str, Care] = {}
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
        """Chips by phase, now."""
        counts: dict[str, int] = {}
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

    async def run(self) -> None:
        """Follow the monitor and heal, until cancelled (a reset under way is left to GpuReset.close)."""
        try:
            while True:
                self._wake.clear()
                self._look(self.monitor.view)
                self._start_due()
                self._write_story()
                await self._sleep()
        finally:
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
        """Seconds until a waiting chip is due (or looked at again for being free); None: only news wakes."""
        now = time.monotonic()
        waiting = [care for care in self.cares.values() if care.phase == WAITING]
        if not waiting or self.resetting:
            return None
        if not self.acting():
            return self.free_poll  # on standby: look again for taking over
        return max(0.0, min(max(care.retry_at - now, 0.0) or self.free_poll for care in waiting))

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
        for uuid, chip in chips.items():
            care = self.cares.get(uuid) or Care(uuid, chip.minor)
            self._set(rules_of.observe(care, diagnose(chip.status, policy), now, self.rules, healing))

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
        """Reset care's chip if it is free (the guard keeps it so meanwhile), then read every chip's health again."""
        async with self.guard(care.uuid) as holder:
            care = self.cares.get(care.uuid) or care
            if not rules_of.due(care, time.monotonic()):
                return  # it came back by itself, or went to an operator, meanwhile
            if holder is not None:
                waiting = rules_of.held(care, holder, time.monotonic() + self.free_poll)
                if waiting.note != care.note:
                    self._event(NORMAL, "GPUHealingWaiting", f"{care.name} waits to be reset: held by {holder}")
                self._set(waiting)
                return
            await self._reset(care)

    async def _reset(self, care: Care) -> None:
        chip = self._chip(care.uuid)
        xids = frozenset() if chip is None else chip.status.xids
        care = rules_of.started(care)
        self._set(care)
        what = f"for {', '.join(care.causes)}" if care.causes else ""
        self._event(NORMAL, "GPUHealingReset", f"{care.name}: resetting it {what} (attempt {care.attempts})")
        log.info("healing %s: resetting it %s (attempt %d)", care.name, what, care.attempts)
        try:
            await self.reset.reset([care.uuid])
        except GpuResetError as error:
            self._reset_failed(care, error)
            return
        view = await self.monitor.clear_xids(care.uuid, xids)
        after = self._diagnosis(view.inventory, care.uuid)
        self.metrics.resets.labels(result="ok" if after.healthy else "still_unhealthy").inc()
        done = rules_of.reset_done(care, after, time.monotonic(), self.rules)
        if done.phase != HEALTHY:
            self._event(WARNING, "GPUHealingFailed", f"{care.name}: {done.note}")
        self._set(done)

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
