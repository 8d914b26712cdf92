"""Whose Volcano annotations are believed: pure rules over a pod as the API server shows it.

A pod's `iluvatar.com/DevVolcano` and `predicate-time` steer Allocate, and any tenant can write them on their own
pod. They are believed only when the pod asks for the resource (a container's limits or requests name it) on this
node (spec.nodeName), and when the API server records Volcano's scheduler as the writer of each of them (the field
manager owning `f:metadata` -> `f:annotations` -> `f:<key>` in metadata.managedFields, and no other). The field
manager is the writer's own word (a request may name any manager, or set managedFields), so this stops a tenant's
`kubectl annotate`, edit or apply, and a mistake; it is an admission policy that keeps others from writing as the
scheduler (docs/deployment.md).

A refusal is said once per pod: a line in the log and a Warning Event on the pod, in its namespace, where
`kubectl describe pod` shows it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.objects import PodDoc

REFUSED_REASON = "VolcanoAnnotationRefused"
COMPONENT = "ix-device-plugin"
MESSAGE_LIMIT = 1024  # the API server's limit on an Event's message
SHOWN_LIMIT = 64  # characters of a name written by another process shown in a message


def asks_for(pod: PodDoc, resource_name: str) -> bool:
    """True when a container (or init container) of the pod has a limit or request on resource_name above 0."""
    return any(
        quantities.get(resource_name, "0") not in ("", "0")
        for container in (*pod.containers, *pod.init_containers)
        for quantities in (container.limits, container.requests)
    )


@dataclass(frozen=True)
class Trust:
    """Whose Volcano annotations are believed on this node: pods asking for resource_name, written by manager."""

    node: str
    resource_name: str
    manager: str  # the field manager Volcano's scheduler writes as

    def why_not(self, pod: PodDoc, keys: Iterable[str]) -> str | None:
        """Why the pod's annotations keys (those it has) are not believed (None: they are)."""
        if pod.node_name != self.node:
            return f"it is bound to node {shown(pod.node_name)}, not {self.node}"
        if not asks_for(pod, self.resource_name):
            return f"it asks for no {self.resource_name}"
        by_writers: dict[frozenset[str], list[str]] = {}
        for key in (key for key in keys if key in pod.annotations):  # one absent was not forged
            writers = frozenset(pod.annotation_managers.get(key, frozenset()))
            if writers != {self.manager}:
                by_writers.setdefault(writers, []).append(key)
        if not by_writers:
            return None
        writers, wrong = next(iter(by_writers.items()))
        named = " and ".join(wrong) + (" annotation was" if len(wrong) == 1 else " annotations were")
        if not writers:
            return f"its {named} written by no field manager the API server recorded, not by {self.scheduler}"
        others = ", ".join(shown(writer) for writer in sorted(writers))
        return f"its {named} written by {others}, not only by {self.scheduler}"

    @property
    def scheduler(self) -> str:
        """The scheduler, as messages name it."""
        return f"the scheduler ({shown(self.manager)})"


def shown(name: str) -> str:
    """A name another process wrote, quoted and escaped, cut to SHOWN_LIMIT characters."""
    cut = name if len(name) <= SHOWN_LIMIT else name[:SHOWN_LIMIT] + "..."
    return json.dumps(cut)


def refusal_message(pod: PodDoc, why: str) -> str:
    """What the log and the Event say of a pod whose annotations are refused."""
    return f"Volcano mode: pod {pod.namespace}/{pod.name}'s choice of devices is not believed: {why}"


def refusal_event(pod: PodDoc, node: str, message: str, name: str, now: datetime) -> dict[str, Any]:
    """A core/v1 Warning Event on the pod (to create in its namespace), as the kubelet writes its own."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {"name": name},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
            "resourceVersion": pod.resource_version,
        },
        "type": "Warning",
        "reason": REFUSED_REASON,
        "message": message[:MESSAGE_LIMIT],
        "source": {"component": COMPONENT, "host": node},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
    }
