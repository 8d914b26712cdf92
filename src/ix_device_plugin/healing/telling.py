"""The healer's telling: Node Events, log lines, metrics and the story file, of every health change and step.

Each health change and step is a Node Event (NodeEvents), a log line and a metric; each XID the policy does not
ignore is an Event; each chip's story is in the file `list` shows.

Only the pod acting for the node says it (Events, the story and the phases' gauge); a pod on standby is silent, its
log aside. It reads the chips' stories (the healer writes them) and changes none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ix_device_plugin.core.healing import HEALTHY, NEEDS_OPERATOR, OFF, OUT, RESETTING, WAITING, Care, left_unreset
from ix_device_plugin.hardware.backend import XidEvent
from ix_device_plugin.hardware.monitor import HardwareMonitor
from ix_device_plugin.healing.metrics import HealingMetrics
from ix_device_plugin.healing.operatorreturn import RETURN_ANNOTATION
from ix_device_plugin.healing.settings import HealingSettings
from ix_device_plugin.healing.story import story_text
from ix_device_plugin.runtime.files import OutputError, write_atomically
from ix_device_plugin.runtime.lazymetrics import Registry
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.settings.health import HEALTH_POLICY, OPERATOR, xid_name

if TYPE_CHECKING:
    from ix_device_plugin.healing.events import NodeEvents

log = logging.getLogger("ix_device_plugin.healing.healer")  # the healer's voice, whichever part of it speaks

NORMAL, WARNING = "Normal", "Warning"  # the Kubernetes Event types
RESET_LIMIT_REACHED = "GPUResetLimitReached"  # a chip reset too often within the window, left to an operator
RESET_UNAVAILABLE = "GPUResetUnavailable"  # no reset can work on this node: the chip is left to an operator
_MEANINGS = {row.name: row.meaning for row in HEALTH_POLICY}


class Telling:
    """The healer's Events, logs, metrics and story file. events: where Node Events go (None: the log only)."""

    def __init__(
        self,
        monitor: HardwareMonitor,
        cares: Mapping[str, Care],
        settings: HealingSettings,
        events: NodeEvents | None,
        registry: Registry,
    ) -> None:
        self.monitor = monitor
        self.cares = cares
        self.settings = settings
        self.events = events
        self.node = "" if events is None else events.node
        self.metrics = HealingMetrics(registry, self.phases)
        self._story_written = ""
        self._story_errors = OncePerError(log, logging.WARNING)
        self._off_said = ""

    def phases(self) -> Mapping[str, int]:
        """Chips by phase, now; none in a pod on standby (the pod acting for the node counts them)."""
        counts: dict[str, int] = {}
        if not self.settings.acting():
            return counts
        for care in self.cares.values():
            counts[care.phase] = counts.get(care.phase, 0) + 1
        return counts

    def changed(self, before: Care, care: Care) -> None:
        """The chip's story went from before to care: tell of its health changes (Events, logs, metrics)."""
        if before.phase == care.phase:
            return
        if before.phase == HEALTHY:
            said = f"{care.name} is out of service: {', '.join(care.causes)}; {_remedy(care.phase)}"
            self.event(WARNING, "GPUUnhealthy", said)
            log.warning("%s", said)
        if care.phase == HEALTHY:
            self._back(before, care)
        elif care.phase == NEEDS_OPERATOR:
            self._needs_operator(care)

    def still_waiting(self, cares: Iterable[Care]) -> None:
        """A pod that comes to act for the node says again, once, what waits for an operator (GPUNeedsOperator,
        GPUResetLimitReached): the Event of a pod stopped or killed before the API server heard it (the server away,
        say) is not lost, and the API server counts the Events of one reason and message as one. A chip no reset can
        help here keeps its one GPUResetUnavailable."""
        for care in cares:
            if care.phase == NEEDS_OPERATOR and not left_unreset(care):
                self._say_needs_operator(care)

    def _needs_operator(self, care: Care) -> None:
        self.metrics.outcomes.labels(outcome="needs_operator").inc()
        self._say_needs_operator(care)

    def _say_needs_operator(self, care: Care) -> None:
        """The chip needs an operator: why, and the way back. The reset limit, and a node where no reset can work
        (one Event naming what is missing: nothing was tried), have their own reasons, said in place of
        GPUNeedsOperator."""
        how = f"kubectl annotate --overwrite node {self.node or '<node>'} {RETURN_ANNOTATION}={care.uuid}"
        if left_unreset(care):
            by_hand = f"reset it by hand on the node (ixsmi -r -i {care.uuid})"
            self.event(WARNING, RESET_UNAVAILABLE, f"{care.name} {care.note}; {by_hand}, then return it: {how}")
            log.warning("%s %s", care.name, care.note)
            return
        if care.limited:
            reason, said = RESET_LIMIT_REACHED, f"{care.name}: {care.note}"
        else:
            reason, said = "GPUNeedsOperator", f"{care.name} {care.note}"
        self.event(WARNING, reason, f"{said}; once it is fixed, return it: {how}")
        log.warning("%s", said)

    def _back(self, before: Care, care: Care) -> None:
        out = None if before.out_since is None else time.monotonic() - before.out_since
        if out is not None:
            self.metrics.out_of_service.observe(out)
        healed = before.phase == RESETTING
        if healed:
            self.metrics.outcomes.labels(outcome="healed").inc()
        by_hand = care.note.endswith("returned by an operator")
        how = "after a reset" if healed else "returned by an operator" if by_hand else "the problem cleared"
        took = "" if out is None else f" after {out:.1f}s out of service"
        self.event(NORMAL, "GPUHealthy", f"{care.name} is back in service{took}: {how}")
        log.info("%s is back in service%s: %s", care.name, took, how)

    def event(self, type: str, reason: str, message: str) -> None:
        """A Node Event, said only by the pod acting for the node."""
        if self.events is not None and self.settings.acting():
            self.events.record(type, reason, message)

    def record_unreadable(self, why: str) -> None:
        """The node-health record cannot be used: why."""
        self.event(WARNING, "GPUHealthRecordUnreadable", why)

    def xid(self, event: XidEvent) -> None:
        """An XID event on a served chip (from the monitor): a Node Event, unless the policy ignores it.

        A chip's XIDs are one Event per action (a reset clears them; they need an operator) naming the latest, not
        one per XID number: a chip reporting thousands of numbers costs as few API writes as a storm of one, while an
        XID that needs an operator is never hidden behind a storm of those a reset clears."""
        policy, name = self.settings.policy(), xid_name(event.xid)
        if policy.ignores(name):
            return
        chip = next((chip for chip in self.monitor.view.inventory.chips() if chip.uuid == event.uuid), None)
        care = self.cares.get(event.uuid) or Care(event.uuid, None if chip is None else chip.minor)
        meaning = _MEANINGS.get(name)
        action = policy.action(name)
        what = "needs an operator" if action == OPERATOR else "a reset clears it"
        if self.events is not None and self.settings.acting():
            message = f"{care.name}: {name}{f' ({meaning})' if meaning else ''}: {what}"
            self.events.record(WARNING, "GPUXidError", message, key=f"{event.uuid} {action}")

    def say_whether_off(self, healing: bool) -> None:
        """Say in the log when self-healing turns off (and why) or on."""
        why = ""
        if not healing:
            why = (
                "health.selfHealing is false"
                if self.settings.switch() == "false"
                else "no API access to ask the other IXML users (ix-exporter) to let go first; "
                "health.selfHealing: true resets without asking"
            )
        if why != self._off_said:
            if why:
                log.info("self-healing is off (%s): chips a reset could fix stay out of service", why)
            else:
                log.info("self-healing is on: a chip a reset can fix is reset once no container holds it")
            self._off_said = why

    def write_story(self, healing: bool) -> None:
        """Write the story file when a story changed, or when the file is gone."""
        story = self.settings.story
        if story is None or not self.settings.acting():
            return  # a pod on standby leaves the story to the one acting
        said = "on" if healing else f"off ({self._off_said})"
        key = repr((said, sorted((c.uuid, c.phase, c.causes, c.attempts, c.note) for c in self.cares.values())))
        if (key == self._story_written and story.exists()) or not story.parent.parent.is_dir():
            return  # unchanged; or the front end's directory is gone (it is not ours to make)
        try:
            write_atomically(story, story_text(self.cares.values(), said, time.monotonic()))
        except OutputError as error:
            self._story_errors.failed("health story: %s", error)
            return
        self._story_errors.succeeded()
        self._story_written = key


def _remedy(phase: str) -> str:
    return {
        WAITING: "it is reset once no workload holds it",
        NEEDS_OPERATOR: "it needs an operator",
        OUT: "it returns when the problem clears",
        OFF: "self-healing is off: it stays out of service",
        RESETTING: "it is being reset",
    }.get(phase, "")
