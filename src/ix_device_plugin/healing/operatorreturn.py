"""The operator's way back: the Node annotation `iluvatar.com/gpu.return` names chips to return to service.

An operator who fixed a chip that needs one (`kubectl annotate --overwrite node <node> iluvatar.com/gpu.return=<UUID
or index>,...`) makes the healer try one more reset and health check of each chip newly named there, without
restarting the agent. Newly: beside what the node-health record says was named and asked for already
(`returnsSeen`), so that a return made while the agent restarted, or could not reach the API server, is heard.
A Node annotation, not a ConfigMap: it is where the operator already looks (`kubectl describe node` shows it
beside the Events), the agent watches only its own Node (a field selector: each agent sees its own node's
changes, not the fleet's), and it needs read access to Nodes only (the agent never writes the annotation;
naming the chip again after removing it, or among others, asks again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.apiserver.watch import Key

log = logging.getLogger(__name__)

RETURN_ANNOTATION = "iluvatar.com/gpu.return"
MAX_NAMED = 256  # chips one annotation may name: more than any node has


def named_chips(value: str | None) -> frozenset[str]:
    """The chips (UUIDs or indices) an annotation value names: comma-separated, blanks ignored."""
    if not value:
        return frozenset()
    return frozenset(list(filter(None, (part.strip() for part in value.split(","))))[:MAX_NAMED])


def return_annotation(node: Mapping[str, Any]) -> str:
    """The value of the annotation on a Node object ("" when it has none)."""
    return str(((node.get("metadata") or {}).get("annotations") or {}).get(RETURN_ANNOTATION) or "")


class ReturnRequests:
    """Follows the annotation on this agent's Node; each chip newly named is handed to `ask` (the healer).

    Its own watch of the Node (`run`), or the values of one the front end has already (`seen`)."""

    def __init__(
        self,
        api: ApiConnection,
        ask: Callable[[str], bool],
        handled: Callable[[], frozenset[str] | None] = lambda: None,
        read: Callable[[frozenset[str]], None] = lambda named: None,
    ) -> None:
        from ix_device_plugin.apiserver.objects import NODE  # the watch's modules load with API access only
        from ix_device_plugin.apiserver.watch import Mirror

        self.node = api.node_name
        self.ask, self.handled, self.read = ask, handled, read
        what = f"annotation {RETURN_ANNOTATION} of node {self.node}"
        self.mirror = Mirror(api, NODE, return_annotation, what, name=self.node, on_change=self._seen)
        self._named: frozenset[str] | None = None  # as first read: what was named before this agent started

    async def run(self) -> None:
        """Follow the annotation until cancelled (API server outages are waited out by the watch)."""
        await self.mirror.run()

    def _seen(self, nodes: Mapping[Key, str]) -> None:
        self.seen(next(iter(nodes.values()), ""))

    def seen(self, value: str) -> None:
        """The annotation's value now ("" when the Node has none, or is not there)."""
        named = named_chips(value)
        if self._named is None:
            # the first read: new beside what the node's record says was asked for (a return made while no agent
            # watched); without a record, all of it was named before this agent started
            handled = self.handled()
            self._named = named if handled is None else handled
        for chip in sorted(named - self._named):
            log.info("node annotation %s names GPU %s: an operator asks to return it", RETURN_ANNOTATION, chip)
            self.ask(chip)
        self._named = named
        self.read(named)
