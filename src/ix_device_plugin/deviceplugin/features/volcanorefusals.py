"""The pods whose Volcano annotations are refused (volcanotrust.py), each said once.

Said in the log and in a Warning Event on the pod in its namespace, and named by the Allocate error that finds no
other pod.

`refuse` only notes and queues (no I/O: it runs inside Allocate); `write_events` writes the queue, one create per
Event. An Event that cannot be written (no RBAC for Events in the pod's namespace, the API server down) is dropped:
the log line stays, said once per failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ix_device_plugin.deviceplugin.features.volcanotrust import refusal_event, refusal_message
from ix_device_plugin.healing.events import event_name
from ix_device_plugin.runtime.logs import OncePerError

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.apiserver.objects import PodDoc

log = logging.getLogger(__name__)

EVENTS_QUEUED = 64  # refusal Events waiting to be written at most; more are in the log only
NAMED_IN_ERRORS = 3  # refused pods an Allocate error names at most


class Refusals:
    """The node's pods whose annotations were refused, and why (by UID), and their Events to write."""

    def __init__(self, api: ApiConnection, node: str) -> None:
        self.api = api
        self.node = node
        self.refused: dict[str, tuple[PodDoc, str]] = {}
        self._events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(EVENTS_QUEUED)  # (namespace, Event)

    def keep_only(self, pods: Iterable[PodDoc]) -> None:
        """Forget the pods not among pods (gone, finished); one annotated again, by anyone, is judged again."""
        current = {pod.uid: _written(pod) for pod in pods}
        kept = self.refused.items()
        self.refused = {uid: (pod, why) for uid, (pod, why) in kept if current.get(uid) == _written(pod)}

    def refuse(self, pod: PodDoc, why: str) -> None:
        """Say once per pod that its annotations are refused: a log line, and an Event on the pod to write."""
        if pod.uid in self.refused:
            return
        self.refused[pod.uid] = (pod, why)
        message = refusal_message(pod, why)
        log.warning("%s; it is passed over", message)
        if self._events.full():
            log.warning(
                "Volcano mode: %d Events wait to be written; none on %s/%s", EVENTS_QUEUED, pod.namespace, pod.name
            )
            return
        name = event_name(pod.name, time.time_ns())
        self._events.put_nowait((pod.namespace, refusal_event(pod, self.node, message, name, datetime.now(UTC))))

    def named(self, which: Callable[[PodDoc], bool]) -> str:
        """The refused pods which picks, with why, for an Allocate error ("" when none)."""
        refused = [(pod, why) for pod, why in self.refused.values() if which(pod)]
        if not refused:
            return ""
        named = "; ".join(f"pod {pod.namespace}/{pod.name}: {why}" for pod, why in refused[:NAMED_IN_ERRORS])
        more = f"; and {len(refused) - NAMED_IN_ERRORS} more" if len(refused) > NAMED_IN_ERRORS else ""
        return f"; not believed: {named}{more}"

    async def write_events(self) -> None:
        """Write the queued Events, each once, for ever (cancel to stop)."""
        from ix_device_plugin.apiserver.errors import KubeError
        from ix_device_plugin.apiserver.settings import KubeConfigError

        errors = OncePerError(log, logging.WARNING)
        while True:
            namespace, event = await self._events.get()
            try:
                kube = await self.api.kube()
                await kube.create_event(namespace, event)
                errors.succeeded("Volcano mode: Events on pods are written again")
            except (KubeError, KubeConfigError) as error:
                errors.failed("Volcano mode: an Event on a pod: %s; refusals are in this log only meanwhile", error)


def _written(pod: PodDoc) -> tuple[object, ...]:
    """What was written on the pod that its judgement rests on: its annotations and who wrote them."""
    return pod.annotations, pod.annotation_managers
