"""Self-healing composed for a front end: the healer, the Node's Events and the operator's way back, in one place.

The node-agent kit (nodeagent/kit.py) builds it with what only the front end knows (its guard: the node's reset turn
and who holds a chip; its settings, one HealingSettings: its configuration, where its story file goes, whether it
acts for the node) and the node-health record, and spawns `tasks()`; the rest is the same in both modes. A front
end that watches its Node already (DRA: the Node owns the slices) says so (node_watched) and hands each value of the
operator's annotation to `return_seen`, so that the Node is watched once. The kit uses its verbs alone (restore,
wake, settings_changed, return_seen, tasks, close), never its parts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ix_device_plugin.gpureset.purpose import SELF_HEALING, resetting_for
from ix_device_plugin.hardware.monitor import HardwareMonitor
from ix_device_plugin.healing.healer import ChipGuard, Healer
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.healing.settings import HealingSettings
from ix_device_plugin.runtime.lazymetrics import Registry
from ix_device_plugin.settings.health import HealthPolicy

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.gpureset.service import ResetService
    from ix_device_plugin.healing.events import NodeEvents
    from ix_device_plugin.healing.operatorreturn import ReturnRequests


class NodeHealing:
    """The healer of one front end, with its Node Events and the operator's way back when the API server is at hand."""

    def __init__(
        self,
        monitor: HardwareMonitor,
        reset: ResetService,
        guard: ChipGuard,
        api: ApiConnection | None,
        settings: HealingSettings,
        *,
        registry: Registry,
        record: RecordFile | None = None,
    ) -> None:
        self.events: NodeEvents | None = None
        self.requests: ReturnRequests | None = None
        if api is not None:  # the Events' writer and the annotation's watch are loaded with API access only
            from ix_device_plugin.healing.events import NodeEvents

            timing = {} if settings.flush_interval is None else {"flush_interval": settings.flush_interval}
            self.events = NodeEvents(api, api.node_name, written=self._written, dropped=self._dropped, **timing)
        self.healer = Healer(monitor, reset, guard, settings, registry=registry, events=self.events, record=record)
        if api is not None:
            from ix_device_plugin.healing.operatorreturn import ReturnRequests

            healer = self.healer
            self.requests = ReturnRequests(api, healer.operator_return, healer.returns_handled, healer.returns_read)
        self._watch_node = not settings.node_watched  # the front end watches its Node: it hands on the annotation

    def tasks(self) -> dict[str, Callable[[], Awaitable[None]]]:
        """The tasks to run, by name."""
        tasks: dict[str, Callable[[], Awaitable[None]]] = {"healing": self._heal}
        if self.events is not None:
            tasks["node-events"] = self.events.run
        if self.requests is not None and self._watch_node:
            tasks["gpu-return"] = self.requests.run
        return tasks

    def restore(self, policy: HealthPolicy | None = None) -> None:
        """At start, before the monitor's first discovery: what the node-health record says (Healer.restore)."""
        self.healer.restore(policy)

    def wake(self) -> None:
        """Look again at once: a chip waiting to be reset may be free now (a claim unprepared)."""
        self.healer.wake()

    def settings_changed(self) -> None:
        """The configuration changed: self-healing turned on resets the chips it left out, at once."""
        self.healer.settings_changed()

    @property
    def follows_returns(self) -> bool:
        """True when the operator's return annotation is followed (API access)."""
        return self.requests is not None

    def return_seen(self, value: str) -> None:
        """The operator's return annotation's value now, as the front end's watch of its Node read it."""
        if self.requests is not None:
            self.requests.seen(value)

    async def _heal(self) -> None:
        """The healer's task: the resets it asks for are self-healing's."""
        with resetting_for(SELF_HEALING):
            await self.healer.run()

    async def close(self, timeout: float) -> None:
        """At stop, after the tasks: write the Events still pending, within timeout."""
        if self.events is not None:
            await self.events.flush(timeout)

    def _written(self, verb: str) -> None:
        self.healer.metrics.event_writes.labels(verb=verb).inc()

    def _dropped(self, count: int) -> None:
        self.healer.metrics.events_dropped.inc(count)
