"""An input for the reconcile loop: the value of one label of this node, from the Kubernetes API."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.objects import NODE, Object, labels_of
from ix_device_plugin.apiserver.watch import Key, Mirror

_UNSEEN = object()

AlsoFollowed = tuple[Callable[[Object], str], Callable[[str], None]]  # a value of the Node, and who is told it


class NodeLabelWatcher:
    """Follows one label of this node: its value at start, then every change, through API server outages.

    also: what else another part of the agent follows on the same Node (a function of the Node object, and who
    is told its value now and on each change), so that the Node is watched once.
    """

    def __init__(
        self,
        api: ApiConnection,
        label: str,
        also: AlsoFollowed | None = None,
        **watching: Any,
    ) -> None:
        """watching: Mirror's backoff and healthy_for, when not the connection's."""
        self.node = api.node_name
        self.label = label
        self.also = also
        what = f"label {label} of node {self.node}"
        self.mirror = Mirror(api, NODE, self._view, what, name=self.node, on_change=self._seen, **watching)
        self._last: object = _UNSEEN
        self._last_also: object = _UNSEEN
        self._put: Callable[[str | None], None] = lambda value: None

    async def run(self, put: Callable[[str | None], None]) -> None:
        """put(value) with the label's value (None when absent) now and on each change; returns only by cancellation.

        When the API server is down, the node is missing or its watches end, each distinct problem is logged
        once and waited out; the value is put again only when it differs from the last one put (a deleted
        node has no label).
        """
        self._put = put
        await self.mirror.run()

    def _view(self, node: Object) -> tuple[dict[str, str], str]:
        return labels_of(node), self.also[0](node) if self.also is not None else ""

    def _seen(self, nodes: Mapping[Key, tuple[dict[str, str], str]]) -> None:
        labels, other = next(iter(nodes.values()), ({}, ""))
        value = labels.get(self.label)
        if value != self._last:
            self._last = value
            self._put(value)
        if self.also is not None and other != self._last_also:
            self._last_also = other
            self.also[1](other)
