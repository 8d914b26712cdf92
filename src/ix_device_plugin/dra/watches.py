"""The DRA driver's watches of the API server.

The node's ResourceSlices (put back when someone else changes or deletes them) and its Node (whose UID owns them, and
whose annotation brings the operator's GPU returns).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.objects import NODE, RESOURCE_SLICE, uid_of
from ix_device_plugin.apiserver.watch import Key, Mirror
from ix_device_plugin.dra.publisher import StoredSlice, stored_slice
from ix_device_plugin.healing.operatorreturn import return_annotation
from ix_device_plugin.runtime.service import TaskFactory

SlicesSeen = Callable[[Mapping[str, str]], None]  # this driver's slices as stored: name -> resourceVersion
NodeSeen = Callable[[str, str], None]  # the Node's UID, and its iluvatar.com/gpu.return annotation


def node_watches(api: ApiConnection, node: str, slices_seen: SlicesSeen, node_seen: NodeSeen) -> dict[str, TaskFactory]:
    """The two watches' tasks, by name: one watch each, listed by field selector, so that a Node that is not there
    yet costs no polling. slices_seen gets this driver's slices at each change, node_seen the Node's."""

    def slices_changed(stored: Mapping[Key, StoredSlice]) -> None:
        slices_seen({name: found.version for (_, name), found in stored.items() if found.ours})

    def node_changed(nodes: Mapping[Key, tuple[str, str]]) -> None:
        node_seen(*next(iter(nodes.values()), ("", "")))

    slices = Mirror(
        api, RESOURCE_SLICE, lambda obj: stored_slice(obj, node), f"the ResourceSlices of node {node}",
        field_selector={"spec.nodeName": node}, on_change=slices_changed,
    )  # fmt: skip
    owner = Mirror(
        api, NODE, _uid_and_return, f"node {node}", field_selector={"metadata.name": node}, on_change=node_changed
    )
    return {"watch-slices": slices.run, "watch-node": owner.run}


def _uid_and_return(node: Mapping[str, Any]) -> tuple[str, str]:
    """What the driver follows of its Node: its UID (the slices' owner) and the operator's iluvatar.com/gpu.return."""
    return uid_of(node), return_annotation(node)
