"""Watches through the real client library against the API server stand-in: a Mirror reads, then watches from the
read's version; every end of a watch is waited out with backoff, a short-lived or failed watch is followed by a
read again (logged), and no change is lost, even when the API server answers every watch with 410 or ends it at
once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from helpers.waits import stays, until

from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.objects import NODE, POD, labels_of, pod_doc
from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.apiserver.watch import Key, Mirror
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.standins.apiserver import ApiServerStandIn, Recorded

NODE_NAME = "gpu-node-1"
LABEL = "iluvatar.com/device-plugin.config"
LOGGER = "ix_device_plugin.apiserver.watch"


@pytest.fixture
async def apiserver():
    async with ApiServerStandIn() as server:
        server.add_node(NODE_NAME, {LABEL: "first"})
        yield server


@pytest.fixture
async def api(apiserver: ApiServerStandIn, tmp_path: Path):
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    connection = ApiConnection(settings_from({"NODE_NAME": NODE_NAME}, str(kubeconfig), "test"))
    yield connection
    await connection.close()


async def lived(apiserver: ApiServerStandIn, seconds: float = 0.4) -> None:
    """The node's watch stays open for seconds: longer than the followings' healthy_for, so it counts as lived."""
    await apiserver.watching("nodes")
    await stays(lambda: apiserver.open_watches("nodes") == 1, for_=seconds, message="the node's watch open")


RUNNING: list[Following] = []  # stopped after each test, whatever its outcome (see the autouse fixture)


@pytest.fixture(autouse=True)
async def _stop_followings() -> AsyncIterator[None]:
    yield
    while RUNNING:
        following = RUNNING.pop()
        following.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following.task


class Following:
    """A Mirror of the node, run in a task, with every delivery noted."""

    def __init__(self, api: ApiConnection, backoff: Backoff, healthy_for: float = 30.0) -> None:
        RUNNING.append(self)
        self.seen: list[dict[str, str]] = []
        self.mirror = Mirror(
            api,
            NODE,
            labels_of,
            f"node {NODE_NAME}",
            name=NODE_NAME,
            backoff=backoff,
            healthy_for=healthy_for,
            on_change=self._delivered,
        )
        self.task = asyncio.create_task(self.mirror.run())

    def _delivered(self, nodes: Mapping[Key, dict[str, str]]) -> None:
        self.seen.append(next(iter(nodes.values()), {}))

    async def label(self, value: str | None) -> None:
        await until(lambda: bool(self.seen) and self.seen[-1].get(LABEL) == value, timeout=10.0)

    async def stop(self) -> None:
        RUNNING.remove(self)
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def _node_requests(apiserver: ApiServerStandIn) -> list[Recorded]:
    return [r for r in apiserver.requests if r.path in ("/api/v1/nodes", f"/api/v1/nodes/{NODE_NAME}")]


def _shape(request: Recorded) -> tuple[str, str | None]:
    """("read", None) or ("watch", the version it resumes from)."""
    if request.query.get("watch") == "true":
        return "watch", request.query.get("resourceVersion")
    return "read", None


async def test_a_read_then_a_watch_from_its_version_delivers_each_change(api, apiserver):
    following = Following(api, Backoff(0.05, 0.2))
    await following.label("first")
    await until(lambda: len(_node_requests(apiserver)) == 2, timeout=10.0)
    apiserver.set_node_labels(NODE_NAME, {LABEL: "second", "other": "x"})
    await following.label("second")
    apiserver.set_node_labels(NODE_NAME, {LABEL: "second", "other": "x"})  # the same labels: nothing delivered
    apiserver.set_node_labels(NODE_NAME, {LABEL: "third"})
    await following.label("third")
    assert [node.get(LABEL) for node in following.seen] == ["first", "second", "third"]
    read, watch = _node_requests(apiserver)
    assert _shape(read) == ("read", None) and _shape(watch) == ("watch", "1")  # nothing lost between the two
    assert watch.query["fieldSelector"] == f"metadata.name={NODE_NAME}"
    assert watch.query["allowWatchBookmarks"] == "true" and 240 <= int(watch.query["timeoutSeconds"]) < 480
    await following.stop()


async def test_a_watch_that_lived_is_resumed_from_its_last_version_without_a_read(api, apiserver):
    following = Following(api, Backoff(0.05, 0.2), healthy_for=0.3)
    await following.label("first")
    apiserver.set_node_labels(NODE_NAME, {LABEL: "second"})
    await following.label("second")
    seen_version = apiserver.resource_version
    await lived(apiserver)  # its end is the server's timeout
    apiserver.drop_watches()
    await until(lambda: len(_node_requests(apiserver)) == 3, timeout=10.0)
    apiserver.set_node_labels(NODE_NAME, {LABEL: "third"})
    await following.label("third")
    assert [_shape(r) for r in _node_requests(apiserver)] == [
        ("read", None),
        ("watch", "1"),
        ("watch", str(seen_version)),
    ]
    assert following.mirror.backoff.attempt == 1  # started again from its first delay
    await following.stop()


async def test_410_on_resume_reads_again_and_says_so(api, apiserver, caplog):
    following = Following(api, Backoff(0.05, 0.2), healthy_for=0.3)
    await following.label("first")
    await lived(apiserver)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        # While no watch is open the label changes and the server forgets the history: resuming gets 410.
        apiserver.drop_watches()
        apiserver.set_node_labels(NODE_NAME, {LABEL: "after-gone"})
        apiserver.compact()
        await following.label("after-gone")
    shapes = [_shape(r) for r in _node_requests(apiserver)]
    assert shapes[:4] == [("read", None), ("watch", "1"), ("watch", "1"), ("read", None)]
    await until(lambda: len(_node_requests(apiserver)) >= 5, timeout=10.0)
    assert _shape(_node_requests(apiserver)[4]) == ("watch", str(apiserver.resource_version))
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        f"node {NODE_NAME}: the API server no longer keeps the history to resume the watch (410 Expired); "
        "reading it again"
    ]
    await following.stop()


async def test_a_deleted_node_is_delivered_as_gone(api, apiserver):
    following = Following(api, Backoff(0.05, 0.2))
    await following.label("first")
    await until(lambda: len(_node_requests(apiserver)) == 2, timeout=10.0)
    apiserver.remove("nodes", NODE_NAME)
    await until(lambda: following.seen[-1] == {}, timeout=10.0)
    assert following.mirror.items == {}
    await following.stop()


async def test_an_outage_is_waited_out_and_what_changed_meanwhile_is_delivered(api, apiserver, caplog):
    following = Following(api, Backoff(0.05, 0.2))
    await following.label("first")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await apiserver.refuse()
        apiserver.set_node_labels(NODE_NAME, {LABEL: "during"})
        await until(
            lambda: following.mirror.backoff.attempt >= 4, timeout=10.0
        )  # several retries against a closed port
        assert "cannot reach the API server" in following.mirror.problem
        await apiserver.accept()
        await following.label("during")
    assert following.mirror.problem == ""
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == len(set(messages)) <= 3, messages  # each distinct problem once, not once per retry
    await following.stop()


@pytest.mark.parametrize("ending", ["expired", "at once"])
async def test_watches_that_end_at_once_are_backed_off_and_lose_no_change(api, apiserver, caplog, ending):
    following = Following(api, Backoff(0.05, 0.4))
    await following.label("first")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        apiserver.watches_end = ending
        apiserver.drop_watches()
        first = len(apiserver.requests)
        started = time.monotonic()
        await asyncio.sleep(0.3)
        apiserver.set_node_labels(NODE_NAME, {LABEL: "changed-while-hostile"})
        await following.label("changed-while-hostile")  # read again after a watch that ended at once
        await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - started)))
        made = len(apiserver.requests) - first
    # Delays 0.05, 0.1, 0.2, 0.4, 0.4, ... (+-20 %): about 8 rounds of a read and a watch in 2 s, where a
    # client that opens the next watch at once makes hundreds.
    assert 4 <= made <= 24, made
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    expected = (
        "the API server no longer keeps the history to resume the watch (410 Expired)"
        if ending == "expired"
        else "the watch ended within 30s"
    )
    assert f"node {NODE_NAME}: {expected}; reading it again" in messages, messages
    assert len(messages) == len(set(messages)) <= 2, messages  # logged once, not at every end (the drop: one)
    apiserver.watches_end = None
    apiserver.drop_watches()
    apiserver.set_node_labels(NODE_NAME, {LABEL: "watched-again"})
    await following.label("watched-again")
    await following.stop()


async def test_the_backoff_starts_again_only_after_a_watch_lived(api, apiserver):
    following = Following(api, Backoff(0.01, 1.5), healthy_for=0.5)
    await following.label("first")
    apiserver.watches_end = "at once"
    apiserver.drop_watches()
    await until(lambda: following.mirror.backoff.attempt >= 7, timeout=10.0)  # the next delay has grown past 1 s
    apiserver.watches_end = None
    await apiserver.watching("nodes", timeout=10.0)
    assert following.mirror.backoff.attempt >= 7  # a watch open, not yet lived: no reset
    await lived(apiserver, 0.7)
    apiserver.watches_end = "expired"
    ended, before = time.monotonic(), len(apiserver.requests)
    apiserver.drop_watches()
    await until(lambda: len(apiserver.requests) > before, timeout=10.0)
    assert time.monotonic() - ended < 0.6  # the first delay again (0.01 s), not the grown one (over 1 s)
    apiserver.watches_end = None
    await following.stop()


async def test_the_pods_of_a_node_in_every_namespace(api, apiserver):
    apiserver.add_pod("team-a", "train", NODE_NAME)
    apiserver.add_pod("team-b", "elsewhere", "gpu-node-2")
    mirror = Mirror(api, POD, pod_doc, f"pods on node {NODE_NAME}", field_selector={"spec.nodeName": NODE_NAME})
    task = asyncio.create_task(mirror.run())
    assert await mirror.changed(timeout=10)
    assert list(mirror.items) == [("team-a", "train")]
    apiserver.add_pod("team-b", "serve", NODE_NAME, annotations={"a": "1"})
    await until(lambda: ("team-b", "serve") in mirror.items, timeout=10.0)
    assert mirror.items[("team-b", "serve")].annotations == {"a": "1"}
    list_request, watch = [r for r in apiserver.requests if r.path == "/api/v1/pods"]
    assert list_request.query["fieldSelector"] == watch.query["fieldSelector"] == f"spec.nodeName={NODE_NAME}"
    assert watch.query["resourceVersion"] == "3"  # the node, then two pods
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
