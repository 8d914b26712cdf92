"""The Node's Events against the API-server stand-in: what is kept, what is dropped and said, what the names are."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers.reset_support import node_events

from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.healing.events import COMBINED, MAX_KEPT, NodeEvents
from ix_device_plugin.healing.telling import WARNING
from ix_device_plugin.standins.apiserver import ApiServerStandIn

NODE = "gpu-node-1"
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LONGEST_NODE = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # 253 characters: a valid node name


async def connected(apiserver: ApiServerStandIn, tmp_path: Path, node: str) -> ApiConnection:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    return ApiConnection(settings_from({"NODE_NAME": node}, str(kubeconfig), "test"))


@pytest.fixture
async def api(apiserver: ApiServerStandIn, tmp_path: Path) -> AsyncIterator[ApiConnection]:
    connection = await connected(apiserver, tmp_path, NODE)
    yield connection
    await connection.close()


async def test_events_pushed_out_unwritten_are_counted_and_said_once(
    api: ApiConnection, apiserver: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    counted: list[int] = []
    events = NodeEvents(api, NODE, dropped=counted.append)
    with caplog.at_level(logging.WARNING, logger="ix_device_plugin.healing.events"):
        for index in range(MAX_KEPT + 300):  # more distinct Events than are kept, none written yet
            events.record(WARNING, "GPUTest", f"event {index}")
        await events.flush(timeout=10)
    assert sum(counted) == events.dropped == 300
    said = [record.getMessage() for record in caplog.records if "dropped" in record.getMessage()]
    assert len(said) == 1 and "300" not in said[0], said  # the first drop is said; the rest only counted
    assert "ix_device_plugin_node_events_dropped_total" in said[0]
    kept = node_events(apiserver, "GPUTest")
    assert len(kept) == MAX_KEPT and {e["message"] for e in kept} == {f"event {i}" for i in range(300, 556)}


async def test_occurrences_under_one_key_are_one_event_saying_the_latest_message(
    api: ApiConnection, apiserver: ApiServerStandIn
) -> None:
    events = NodeEvents(api, NODE)
    events.record(WARNING, "GPUXidError", "GPU 0: XID 1000: a reset clears it", key="GPU-0 reset")
    await events.flush(timeout=10)
    for xid in range(1001, 3000):
        events.record(WARNING, "GPUXidError", f"GPU 0: XID {xid}: a reset clears it", key="GPU-0 reset")
    await events.flush(timeout=10)
    [event] = node_events(apiserver, "GPUXidError")
    assert event["count"] == 2000 and event["message"] == f"{COMBINED}GPU 0: XID 2999: a reset clears it"
    assert events.writes == 2 and events.dropped == 0  # a create, then one patch of count and message


async def test_a_node_name_of_253_characters_gives_valid_event_names(
    apiserver: ApiServerStandIn, tmp_path: Path
) -> None:
    apiserver.add_node(LONGEST_NODE)
    api = await connected(apiserver, tmp_path, LONGEST_NODE)
    try:
        events = NodeEvents(api, LONGEST_NODE)
        events.record(WARNING, "GPUTest", "one")
        events.record(WARNING, "GPUTest", "two")
        await events.flush(timeout=10)
    finally:
        await api.close()
    written = node_events(apiserver, "GPUTest")
    assert events.dropped == 0 and len(written) == 2
    for event in written:
        name = event["metadata"]["name"]
        assert len(name) <= 253 and DNS_SUBDOMAIN.fullmatch(name), name
        assert event["involvedObject"]["name"] == LONGEST_NODE  # the node itself is named whole
    assert len({event["metadata"]["name"] for event in written}) == 2
