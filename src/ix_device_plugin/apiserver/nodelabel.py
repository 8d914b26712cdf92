"""An input for the reconcile loop: the value of one label of this node, from the Kubernetes API."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.objects import NODE, labels_of
from ix_device_plugin.apiserver.watch import Key, Mirror

_UNSEEN = object()


class NodeLabelWatcher:
    """Follows one label of this node: its value at start, then every change, through API server outages."""

    def __init__(self, api: ApiConnection, label: str, **watching: Any) -> None:
        """watching: Mirror's backoff and healthy_for, when not the connection's."""
        self.node = api.node_name
        self.label = label
        what = f"label {label} of node {self.node}"
        self.mirror = Mirror(api, NODE, labels_of, what, name=self.node, on_change=self._seen, **watching)
        self._last: object = _UNSEEN
        self._put: Callable[[str | None], None] = lambda value: None

    async def run(self, put: Callable[[str | None], None]) -> None:
        """put(value) with the label's value (None when absent) now and on each change; returns only by cancellation.

        When the API server is down, the node is missing or its watches end, each distinct problem is logged
        once and waited out; the value is put again only when it differs from the last one put (a deleted
        node has no label).
        """
        self._put = put
        await self.mirror.run()

    def _seen(self, nodes: Mapping[Key, dict[str, str]]) -> None:
        value = next(iter(nodes.values()), {}).get(self.label)
        if value != self._last:
            self._last = value
            self._put(value)
