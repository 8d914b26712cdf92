"""NodeLabelWatcher: one label of this node, followed through the one API connection, outages and a missing node."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from helpers.waits import stays, until

from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.nodelabel import NodeLabelWatcher
from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.standins.apiserver import ApiServerStandIn

NODE = "gpu-node-1"
LABEL = "iluvatar.com/device-plugin.config"
FAST = Backoff(initial=0.05, cap=0.2)


@pytest.fixture
async def api(apiserver: ApiServerStandIn, tmp_path: Path):
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    connection = ApiConnection(settings_from({"NODE_NAME": NODE}, str(kubeconfig), "test"), FAST)
    yield connection
    await connection.close()


class _Puts:
    def __init__(self) -> None:
        self.values: list[str | None] = []

    def __call__(self, value: str | None) -> None:
        self.values.append(value)

    async def wait(self, *expected: str | None) -> None:
        await until(lambda: tuple(self.values) == expected, timeout=10.0)


async def _run_watcher(api: ApiConnection, puts: _Puts) -> asyncio.Task[None]:
    return asyncio.create_task(NodeLabelWatcher(api, LABEL).run(puts))


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_node_label_watcher_puts_the_value_and_each_change(api, apiserver):
    puts = _Puts()
    task = await _run_watcher(api, puts)
    await puts.wait(None)
    await until(lambda: any(r.query.get("watch") == "true" for r in apiserver.requests), timeout=10.0)
    apiserver.set_node_labels(NODE, {LABEL: "small"})
    await puts.wait(None, "small")
    apiserver.set_node_labels(NODE, {LABEL: "small", "other": "x"})  # another label: nothing to put
    apiserver.set_node_labels(NODE, {LABEL: "large", "other": "x"})
    await puts.wait(None, "small", "large")
    apiserver.set_node_labels(NODE, {"other": "x"})
    await puts.wait(None, "small", "large", None)
    await _stop(task)


async def test_node_label_watcher_survives_the_api_server_down(api, apiserver, caplog):
    apiserver.set_node_labels(NODE, {LABEL: "before"})
    puts = _Puts()
    watcher = NodeLabelWatcher(api, LABEL)
    with caplog.at_level(logging.WARNING, logger="ix_device_plugin.apiserver.watch"):
        task = asyncio.create_task(watcher.run(puts))
        await puts.wait("before")
        await until(lambda: any(r.query.get("watch") == "true" for r in apiserver.requests), timeout=10.0)
        await apiserver.refuse()
        apiserver.set_node_labels(NODE, {LABEL: "during"})
        await until(lambda: watcher.mirror.backoff.attempt >= 4, timeout=10.0)  # several retries against a closed port
        assert not task.done()
        await apiserver.accept()
        await puts.wait("before", "during")
        apiserver.set_node_labels(NODE, {LABEL: "after"})
        await puts.wait("before", "during", "after")
        await _stop(task)
    messages = [r.getMessage() for r in caplog.records]
    assert any("cannot reach the API server" in message for message in messages), messages
    assert len(messages) == len(set(messages)) < 4, messages  # each distinct problem once, not once per retry
    assert all(message.startswith(f"label {LABEL} of node {NODE}: ") for message in messages)


async def test_node_label_watcher_waits_out_503_and_a_missing_node(api, apiserver, caplog):
    apiserver.unavailable = True
    puts = _Puts()
    with caplog.at_level(logging.WARNING, logger="ix_device_plugin.apiserver.watch"):
        task = await _run_watcher(api, puts)
        await until(lambda: len(apiserver.requests) >= 3, timeout=10.0)
        apiserver.unavailable = False
        await puts.wait(None)
        await _stop(task)
        apiserver._objects.clear()
        puts = _Puts()
        task = await _run_watcher(api, puts)
        await until(lambda: any("404" in r.getMessage() for r in caplog.records), timeout=10.0)
        apiserver.add_node(NODE, {LABEL: "new-node"})
        await puts.wait("new-node")
    messages = [r.getMessage() for r in caplog.records]
    assert sum("503" in message for message in messages) == 1
    assert sum("404" in message for message in messages) == 1
    await _stop(task)


async def test_an_unusable_kubeconfig_is_named_and_waited_out(apiserver, tmp_path, caplog):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{not yaml: [")
    api = ApiConnection(settings_from({"NODE_NAME": NODE}, str(kubeconfig), "test"), FAST)
    puts = _Puts()
    with caplog.at_level(logging.WARNING, logger="ix_device_plugin.apiserver.watch"):
        task = await _run_watcher(api, puts)
        await until(lambda: any(str(kubeconfig) in r.getMessage() for r in caplog.records), timeout=10.0)
        assert not task.done() and puts.values == []
        await _stop(task)
    message = next(r.getMessage() for r in caplog.records)
    assert message.startswith(f"label {LABEL} of node {NODE}: kubeconfig {kubeconfig}: ")
    assert "cannot reach" not in message  # the API server was never tried
    assert apiserver.requests == []
    await api.close()


async def test_a_node_unchanged_since_the_history_kept_is_watched_once(api, apiserver):
    """The Node's own resourceVersion is older than the watch history (no change since an API server restart or a
    compaction): the watch starts from the version of a read of the node, not of the node, so it is not answered
    410 Expired again and again: one read and one watch."""
    apiserver.add_node(NODE, {LABEL: "small"})
    apiserver.put("configmaps", {"metadata": {"name": "other", "namespace": "default"}})  # later versions
    apiserver.compact()
    puts = _Puts()
    task = await _run_watcher(api, puts)
    await puts.wait("small")

    def one_read_and_one_watch() -> bool:
        reads = [r for r in apiserver.requests if "nodes" in r.path and r.query.get("watch") != "true"]
        watches = [r for r in apiserver.requests if "nodes" in r.path and r.query.get("watch") == "true"]
        return (len(reads), len(watches)) == (1, 1)

    # FAST backs off at most 0.2 s: a re-read loop would show within the second.
    await stays(one_read_and_one_watch, for_=1.0, message="one read of the node and one watch")
    await _stop(task)


async def test_one_watch_of_the_node_brings_the_label_and_what_else_is_followed_on_it(api, apiserver):
    """The device plugin's self-healing follows the operator's annotation through the label's watch: each value
    of the annotation is handed on once, label changes do not repeat it, and the Node is watched once."""
    puts, annotations = _Puts(), _Puts()

    def annotation(node: dict) -> str:
        return str(((node.get("metadata") or {}).get("annotations") or {}).get("example.com/ask", ""))

    watcher = NodeLabelWatcher(api, LABEL, (annotation, annotations))
    task = asyncio.create_task(watcher.run(puts))
    await puts.wait(None)
    await annotations.wait("")
    node = apiserver.get("nodes", NODE)
    assert node is not None
    node["metadata"].setdefault("annotations", {})["example.com/ask"] = "GPU-1"
    apiserver.put("nodes", node)
    await annotations.wait("", "GPU-1")
    apiserver.set_node_labels(NODE, {LABEL: "small"})
    await puts.wait(None, "small")
    assert annotations.values == ["", "GPU-1"]  # the label changed, the annotation did not
    watches = [r for r in apiserver.requests if r.query.get("watch") == "true" and "/nodes" in r.path]
    assert len(watches) == 1
    await _stop(task)
