"""Kubernetes Events on the Node, where `kubectl describe node` shows them, aggregated so that a storm is one write.

`record` only notes an occurrence (no I/O); `run` writes. The first occurrence of an Event (its type, reason and
message, or the key its caller gives) is created at once; repeats only raise its count, and are written as one patch
of `count` and `lastTimestamp` at most every FLUSH_INTERVAL, however many there were: a storm of one XID is one Event
with a count, never one API write per occurrence. Occurrences under one key with different messages are one Event
too, saying the latest message as client-go's aggregator says it (`(combined from similar events): ...`): a caller
whose messages vary without bound (one per XID number) keys them by what they are about, and its writes stay bounded.
Events are posted in the namespace `default` with the Node as involved object (uid: the node's name), as the kubelet
posts its own node Events: the API server accepts a cluster-scoped object's Events there. Each is named
`<node>.<hex>`, the node's part cut where the node's name is too long for the Event's to stay a DNS subdomain.
A write that fails is retried with the connection's backoff; one refused (no RBAC for Events) drops what is pending,
said once. At most MAX_KEPT Events are remembered; occurrences never written (pushed out of that memory, refused, or
pending at stop) are counted (`dropped`), and said in the log the first time.
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

EVENT_NAMESPACE = "default"  # where the API server takes Events of a cluster-scoped object, as the kubelet's
COMPONENT = "ix-device-plugin"
FLUSH_INTERVAL = 10.0  # seconds: repeats of an Event are written at most this often
MAX_KEPT = 256  # Events remembered for aggregation, most recent first kept
MESSAGE_LIMIT = 1024  # the API server's limit on an Event's message
NAME_LIMIT = 253  # an Event's name is a DNS subdomain: <node>.<hex>, the node's part cut to fit
COMBINED = "(combined from similar events): "  # client-go's prefix for one Event standing for several messages
Written = Callable[[str], None]  # told "create", "patch" or "failed" for each write
Dropped = Callable[[int], None]  # told how many occurrences were dropped, unwritten


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
    written_message: str = ""  # the message the API server holds
    name: str = ""
    write_after: float = 0.0  # monotonic


class NodeEvents:
    """The Node's Events of this agent, written by `run` (one task); `record` from anywhere on the event loop."""

    def __init__(
        self,
        api: ApiConnection,
        node: str,
        *,
        flush_interval: float = FLUSH_INTERVAL,
        written: Written | None = None,
        dropped: Dropped | None = None,
    ) -> None:
        self.api = api
        self.node = node
        self.flush_interval = flush_interval
        self.writes = 0  # API writes made (creates and patches)
        self.dropped = 0  # occurrences never written
        self._written = written or (lambda verb: None)
        self._dropped = dropped or (lambda count: None)
        self._events: OrderedDict[tuple[str, str, str], _Pending] = OrderedDict()
        self._wake = asyncio.Event()
        self._errors = OncePerError(log, logging.WARNING)
        self._drop_said = False

    def record(self, type: str, reason: str, message: str, key: str | None = None) -> None:
        """One occurrence of an Event (type Normal or Warning) on the Node; key: what makes occurrences one Event
        (None: the message itself), the latest message standing for them all."""
        message = message[:MESSAGE_LIMIT]
        index, now = (type, reason, message if key is None else key), _now()
        pending = self._events.get(index)
        if pending is None:
            self._events[index] = _Pending(type, reason, message, now, now)
            while len(self._events) > MAX_KEPT:
                _, old = self._events.popitem(last=False)
                self._drop(old.count - old.written, f"pushed out by newer ones: at most {MAX_KEPT} Events are kept")
        else:
            pending.count += 1
            pending.last = now
            combined = (COMBINED + message)[:MESSAGE_LIMIT]
            if pending.message not in (message, combined):
                pending.message = combined
            self._events.move_to_end(index)
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
        """Give up on what is pending (the caller said why): counted as dropped."""
        for event in self._events.values():
            self._drop(event.count - event.written, "")
            event.written = event.count

    def _drop(self, count: int, why: str) -> None:
        """count occurrences will never be written: counted; why (empty: said already) is logged the first time
        only, later drops are only counted."""
        if count <= 0:
            return
        if why and not self._drop_said:
            log.warning(
                "Node Events: %d occurrences dropped unwritten (%s); drops from now on are counted in "
                "ix_device_plugin_node_events_dropped_total, not logged",
                count,
                why,
            )
            self._drop_said = True
        self.dropped += count
        self._dropped(count)

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
                self._drop_pending()

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
        count, message = event.count, event.message
        if event.written and event.name:
            patch: dict[str, Any] = {"count": count, "lastTimestamp": _stamp(event.last)}
            if message != event.written_message:
                patch["message"] = message
            try:
                await kube.patch_event(EVENT_NAMESPACE, event.name, patch)
                self._wrote("patch", event, count, message)
                return
            except KubeNotFound:
                event.name = ""  # it expired (the API server keeps Events an hour): a new one
        for _ in range(2):
            if not event.name:
                event.name = event_name(self.node, time.time_ns())
            try:
                await kube.create_event(EVENT_NAMESPACE, self._body(event, count, message))
                self._wrote("create", event, count, message)
                return
            except KubeAlreadyExists:
                event.name = ""

    def _wrote(self, verb: str, event: _Pending, count: int, message: str) -> None:
        event.written, event.written_message = count, message
        self.writes += 1
        self._written(verb)

    def _body(self, event: _Pending, count: int, message: str) -> dict[str, Any]:
        return {
            "metadata": {"name": event.name},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node},
            "type": event.type,
            "reason": event.reason,
            "message": message,
            "source": {"component": COMPONENT, "host": self.node},
            "firstTimestamp": _stamp(event.first),
            "lastTimestamp": _stamp(event.last),
            "count": count,
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
        }


def event_name(node: str, unique: int) -> str:
    """`<node>.<unique in hex>`, within NAME_LIMIT: a long node name is cut (a node's name may take all 253
    characters), and the cut ends on a letter or digit, as each part of a DNS subdomain must."""
    suffix = f".{unique:x}"
    return node[: NAME_LIMIT - len(suffix)].rstrip("-.") + suffix


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
