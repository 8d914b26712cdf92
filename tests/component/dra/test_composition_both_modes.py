"""A node task added once to the node-agent kit runs in both modes: the device plugin and the DRA driver start every
task the kit returns, on every pod and on the pod acting for the node."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from helpers.dra_support import DraNode
from helpers.waits import until

from ix_device_plugin.nodeagent.kit import NodeAgent
from ix_device_plugin.runtime.service import TaskFactory


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names of the two tasks added to the kit (one every pod runs, one a duty of the acting pod), once run."""
    seen: set[str] = set()
    tasks = NodeAgent.tasks

    def with_added(self: NodeAgent[Any], duties: Mapping[str, Callable[[], Any]] | None = None, **kw: Any) -> Any:
        async def added(name: str) -> None:
            seen.add(name)
            await asyncio.Event().wait()

        own = {**(duties or {}), "added-duty": lambda: added("added-duty")}
        found: dict[str, TaskFactory] = tasks(self, own, **kw)
        return {**found, "added-task": lambda: added("added-task")}

    monkeypatch.setattr(NodeAgent, "tasks", with_added)
    return seen


async def test_a_task_added_to_the_kit_runs_in_device_plugin_mode(start_daemon: Any, ran: set[str]) -> None:
    await start_daemon()
    await until(lambda: ran == {"added-task", "added-duty"})


async def test_a_task_added_to_the_kit_runs_in_dra_mode(node: DraNode, ran: set[str]) -> None:
    await node.start()
    await until(lambda: ran == {"added-task", "added-duty"})
