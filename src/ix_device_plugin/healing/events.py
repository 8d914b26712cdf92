"""Kubernetes Events on the Node, where `kubectl describe node` shows them, aggregated so that a storm is one write.

`record` only notes an occurrence (no I/O); `run` writes. The first occurrence of an Event (its type, reason and
message) is created at once; repeats only raise its count, and are written as one patch of `count` and
`lastTimestamp` at most every FLUSH_INTERVAL, however many there were: a storm of one XID is one Event with a count,
never one API write per occurrence. Events are posted in the namespace `default` with the Node as involved object
(uid: the node's name), as the kubelet posts its own node Events: the API server accepts a cluster-scoped object's
Events there. A write that fails is retried with the connection's backoff; one refused (no RBAC for Events) drops
what is pending, said once. At most MAX_KEPT Events are remembered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ix_device_plugin.runtime.logs import OncePerError

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection

log = logging.getLogger(__name__)

NORMAL, WARNING = "Normal", "Warning"
EVENT_NAMESPACE = "default"  # where the API server takes Events of a cluster-scoped object, as the kubelet's
COMPONENT = "ix-device-plugin"
FLUSH_INTERVAL = 10.0  # seconds: repeats of an Event are written at most this often
MAX_KEPT = 256  # Events remembered for aggregation, most recent first kept
MESSAGE_LIMIT = 1024  # the API server's limit on an Event's message
Written = Callable[[str], None]  # told "create", "patch" or "failed" for each write


@dataclass
class _Pending:
    """One Event: how often it happened, how much of that the API server holds, and when it may be written next."""

    type: str
    reason: str
    message: str
    first: datetime
    last: datetime
    count: int = 1
    written: int = 0  # the count the API server holds (0: not created yet)
    name: str = ""
    write_after: float = 0.0  # monotonic


class NodeEvents:
    """The Node's Events of this agent, written by `run` (one task); `record` from anywhere on the event loop."""

    def __init__(
        self, api: ApiConnection, node: str, *, flush_interval: float = FLUSH_INTERVAL, written: Written | None = None
    ) -> None:
        self.api = api
        self.node = node
        self.flush_interval = flush_interval
        self.writes = 0  # API writes made (creates and patches)
        self._written = written or (lambda verb: None)
        self._events: OrderedDict[tuple[str, str, str], _Pending] = OrderedDict()
        self._wake = asyncio.Event()
        self._errors = OncePerError(log, logging.WARNING)

    def record(self, type: str, reason: str, message: str) -> None:
        """One occurrence of an Event (type NORMAL or WARNING) on the Node."""
        message = message[:MESSAGE_LIMIT]
        key, now = (type, reason, message), _now()
        pending = self._events.get(key)
        if pending is None:
            self._events[key] = _Pending(type, reason, message, now, now)
            while len(self._events) > MAX_KEPT:
                self._events.popitem(last=False)
        else:
            pending.count += 1
            pending.last = now
            self._events.move_to_end(key)
        self._wake.set()

    def pending(self) -> int:
        """Occurrences not written yet."""
        return sum(event.count - event.written for event in self._events.values())

    async def run(self) -> None:
        """Write what was recorded, for ever (cancel to stop)."""
        backoff = self.api.backoff()
        while True:
            self._wake.clear()
            try:
                wait = await self._write_due()
            except Exception as error:  # the API server: failed writes stay pending and are tried again
                self._written("failed")
                if getattr(error, "transient", True):
                    self._errors.failed("Node Events: %s; retrying", error)
                    wait = backoff.next_delay()
                else:  # refused (RBAC, validation): trying again cannot help; what is pending is dropped
                    self._errors.failed("Node Events: %s; Events are dropped until one is accepted", error)
                    self._drop_pending()
                    wait = None
            else:
                self._errors.succeeded("Node Events are written again")
                backoff.reset()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    def _drop_pending(self) -> None:
        for event in self._events.values():
            event.written = event.count

    async def flush(self, timeout: float) -> None:
        """At stop: write what is pending now, within timeout; what cannot be written is dropped (and said)."""
        for event in self._events.values():
            event.write_after = 0.0
        try:
            async with asyncio.timeout(timeout):
                await self._write_due()
        except Exception as error:
            if self.pending():
                log.warning("Node Events: %d not written before stopping: %s", self.pending(), error)

    async def _write_due(self) -> float | None:
        """Write every Event due now; seconds until the next is due (None: none pending)."""
        now = time.monotonic()
        soonest: float | None = None
        for event in list(self._events.values()):
            if event.count == event.written:
                continue
            if event.write_after > now:
                soonest = min(soonest or event.write_after, event.write_after)
                continue
            await self._write(event)
            event.write_after = time.monotonic() + self.flush_interval
        return None if soonest is None else max(0.0, soonest - time.monotonic())

    async def _write(self, event: _Pending) -> None:
        from ix_device_plugin.apiserver.errors import KubeAlreadyExists, KubeNotFound

        kube = await self.api.kube()
        count = event.count
        if event.written and event.name:
            try:
                await kube.patch_event(
                    EVENT_NAMESPACE, event.name, {"count": count, "lastTimestamp": _stamp(event.last)}
                )
                self._wrote("patch", event, count)
                return
            except KubeNotFound:
                event.name = ""  # it expired (the API server keeps Events an hour): a new one
        for _ in range(2):
            if not event.name:
                event.name = f"{self.node}.{time.time_ns():x}"
            try:
                await kube.create_event(EVENT_NAMESPACE, self._body(event, count))
                self._wrote("create", event, count)
                return
            except KubeAlreadyExists:
                event.name = ""

    def _wrote(self, verb: str, event: _Pending, count: int) -> None:
        event.written = count
        self.writes += 1
        self._written(verb)

    def _body(self, event: _Pending, count: int) -> dict[str, Any]:
        return {
            "metadata": {"name": event.name},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node},
            "type": event.type,
            "reason": event.reason,
            "message": event.message,
            "source": {"component": COMPONENT, "host": self.node},
            "firstTimestamp": _stamp(event.first),
            "lastTimestamp": _stamp(event.last),
            "count": count,
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
        }


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
