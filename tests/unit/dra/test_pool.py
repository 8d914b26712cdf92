"""The pool's slices: cut to the API's limits, named for any node, compared the way the server stores them."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from ix_device_plugin.core.inventory import Board, Chip, Inventory
from ix_device_plugin.dra.pool import (
    MAX_DEVICES,
    MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
    owned_slice,
    pool_objects,
    quantity,
    same_owner,
    same_spec,
    slice_base_name,
    slice_names,
)
from ix_device_plugin.dra.slices import MAX_ATTRIBUTE_LENGTH, slice_content, slice_devices

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def devices(count: int, tainted: int = 0) -> list[dict]:
    return [
        {"name": f"gpu-{i}", **({"taints": [{"key": "k", "effect": "NoSchedule"}]} if i < tainted else {})}
        for i in range(count)
    ]


@pytest.mark.parametrize(
    ("count", "tainted", "sizes"),
    [
        (0, 0, [0]),
        (128, 0, [128]),
        (129, 0, [128, 1]),
        (66, 1, [64, 2]),  # 33 BI-V150 boards, one bad chip: two slices the server accepts
        (256, 0, [128, 128]),
    ],
)
def test_a_pool_is_cut_to_the_per_slice_limits(count: int, tainted: int, sizes: list[int]) -> None:
    objects = pool_objects("node-a", devices(count, tainted), 7, "uid-1")
    assert [len(obj["spec"]["devices"]) for obj in objects] == sizes
    assert {obj["spec"]["pool"]["resourceSliceCount"] for obj in objects} == {len(sizes)}
    assert {obj["spec"]["pool"]["generation"] for obj in objects} == {7}
    assert [obj["metadata"]["name"] for obj in objects] == slice_names("node-a", len(sizes))
    owner = objects[0]["metadata"]["ownerReferences"]
    assert owner == [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1", "controller": True}]
    for obj in objects:
        limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if tainted else MAX_DEVICES
        assert len(obj["spec"]["devices"]) <= limit


@pytest.mark.parametrize("node", ["node-a", "n" * 236, "a" * 240, "b." * 126 + "b", "x" * 253])
def test_slice_names_are_valid_for_any_node_name(node: str) -> None:
    for name in slice_names(node, 3):
        assert len(name) <= 253 and DNS_SUBDOMAIN.match(name), name
    assert slice_base_name("node-a") == "node-a-gpu.iluvatar.com"
    assert len(set(slice_names(node, 3))) == 3


def test_long_names_of_different_nodes_do_not_collide() -> None:
    assert slice_base_name("n" * 250 + "a") != slice_base_name("n" * 250 + "b")


@pytest.mark.parametrize(
    ("text", "value"),
    [("32768Mi", Decimal(32 * 2**30)), ("32Gi", Decimal(32 * 2**30)), ("1.5k", Decimal(1500)), ("5e3", Decimal(5000))],
)
def test_quantities_are_read_as_the_server_normalises_them(text: str, value: Decimal) -> None:
    assert quantity(text) == value


def test_a_memory_capacity_the_server_rewrote_is_the_same_spec() -> None:
    (sent,) = pool_objects("node-a", [{"name": "gpu-0", "capacity": {"memory": {"value": "32768Mi"}}}], 1, None)
    stored = {**sent["spec"], "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "32Gi"}}}]}
    stored["pool"] = {**stored["pool"], "generation": 5}
    assert same_spec(sent["spec"], stored)
    changed = {**stored, "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "16Gi"}}}]}
    assert not same_spec(sent["spec"], changed)


def test_attribute_values_over_64_characters_are_cut_or_left_out_and_said() -> None:
    long_uuid = "GPU-" + "a" * 75  # IXML's buffer allows 79 characters
    chip = Chip(long_uuid, 0, "Iluvatar " + "BI-V150S " * 10, bus_id="0000:8a:00.0", numa_node=1)
    content = slice_content(Inventory(boards=(Board("BI-V150S", (chip,)),), driver_version="4.1.0"))
    (body,) = slice_devices(content, {}, taints=True)
    attributes = body["attributes"]
    assert "uuid" not in attributes and "boardUUID" not in attributes
    assert len(attributes["productName"]["string"]) == MAX_ATTRIBUTE_LENGTH
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:8a:00.0"}
    assert attributes["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert any("attribute uuid" in w and "left out" in w for w in content.warnings)
    assert any("attribute productName" in w and "cut" in w for w in content.warnings)


def test_the_publisher_says_a_slice_is_missing_and_asks_to_publish_again() -> None:
    from ix_device_plugin.dra.publisher import SlicePublisher, stored_slice

    publisher = SlicePublisher(None, "node-a")  # type: ignore[arg-type]  # no API call is made here
    published = pool_objects("node-a", devices(2), 1, None)
    published[0]["metadata"]["resourceVersion"] = "7"
    publisher.published = published
    asked = publisher._generation
    publisher.seen({published[0]["metadata"]["name"]: "7"})
    assert publisher.missing() == [] and publisher._generation == asked  # as published: nothing to do
    publisher.seen({})
    assert publisher.missing() == [published[0]["metadata"]["name"]] and publisher._generation == asked + 1
    assert stored_slice(published[0], "node-a").ours and not stored_slice({"spec": {"driver": "x"}}, "node-a").ours


def test_a_pool_slice_is_found_by_label_or_by_driver_node_pool_and_name() -> None:
    first, second = pool_objects("node-a", devices(1), 1, "uid-1", [{"name": "board-0", "counters": {}}])
    assert owned_slice(first, "node-a") and owned_slice(second, "node-a")
    unlabelled = {**first, "metadata": {"name": first["metadata"]["name"]}}
    assert owned_slice(unlabelled, "node-a")  # its label removed by another writer: still the pool's
    assert not owned_slice(unlabelled, "node-b")
    renamed = {**unlabelled, "metadata": {"name": "node-a-gpu.iluvatar.com-x"}}
    assert owned_slice(renamed, "node-a")  # not a name the pool gives, but in its pool
    repooled = {**unlabelled, "spec": {**first["spec"], "pool": {"name": "elsewhere"}}}
    assert owned_slice(repooled, "node-a")  # another pool, but one of the pool's names
    assert not owned_slice({**repooled, "metadata": renamed["metadata"]}, "node-a")  # neither, and no label
    assert not owned_slice({**first, "spec": {**first["spec"], "driver": "net.example.com"}}, "node-a")


def test_owner_references_are_compared_exactly() -> None:
    (owned,) = pool_objects("node-a", devices(1), 1, "uid-2")
    (ownerless,) = pool_objects("node-a", devices(1), 1, None)
    (old,) = pool_objects("node-a", devices(1), 1, "uid-1")
    assert same_owner(owned, owned) and same_owner(ownerless, ownerless)
    assert not same_owner(owned, old)  # the Node was re-created: the reference follows
    assert not same_owner(owned, ownerless)  # the Node appeared
    assert not same_owner(ownerless, old)  # the Node is gone: a reference to it would have the slice deleted
