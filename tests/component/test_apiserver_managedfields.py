"""The API server stand-in records metadata.managedFields as kube-apiserver does for writes that are not
server-side apply: the writer from the fieldManager parameter or the user agent, fields moving to whoever changes
them, and managedFields a request sets replacing the record."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.apiserver.managedfields import Writer, decode, encode, manager_of, record_write

HEADERS = {"Authorization": "Bearer standin-token"}
MERGE = {**HEADERS, "Content-Type": "application/merge-patch+json"}
KUBECTL = "kubectl-create/v1.35.0 (linux/amd64) kubernetes/66452049"  # client-go's user agent: the program first
SCHEDULER = "vc-scheduler/v0.0.0 (linux/amd64) kubernetes/$Format"
PODS = "/api/v1/namespaces/ml/pods"


@pytest.fixture
async def server():
    async with ApiServerStandIn() as standin:
        yield standin


async def _send(server: ApiServerStandIn, method: str, path: str, body: Any, agent: str, **query: str) -> dict:
    headers = {**(MERGE if method == "PATCH" else HEADERS), "User-Agent": agent}
    async with (
        aiohttp.ClientSession(server.url, headers=headers) as http,
        http.request(method, path, json=body, params=query) as response,
    ):
        assert response.status in (200, 201), await response.text()
        return json.loads(await response.read())


def _owners(obj: dict) -> dict[str, set[tuple[str, ...]]]:
    """manager -> the fields it owns."""
    return {entry["manager"]: decode(entry["fieldsV1"]) for entry in obj["metadata"].get("managedFields", [])}


def _pod(annotations: dict[str, str]) -> dict:
    return {"metadata": {"name": "p", "annotations": annotations}, "spec": {"containers": [{"name": "main"}]}}


async def test_a_create_is_owned_by_the_user_agents_program_as_the_real_server_records_it(server):
    created = await _send(server, "POST", PODS, _pod({"a": "1"}), KUBECTL)
    (entry,) = created["metadata"]["managedFields"]
    assert {key: entry[key] for key in ("manager", "operation", "apiVersion", "fieldsType")} == {
        "manager": "kubectl-create",
        "operation": "Update",
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
    }
    assert entry["time"].endswith("Z")
    assert entry["fieldsV1"] == {
        "f:metadata": {"f:annotations": {".": {}, "f:a": {}}},
        "f:spec": {"f:containers": {}},
    }


async def test_a_changed_field_moves_to_its_writer_and_an_unchanged_one_stays(server):
    await _send(server, "POST", PODS, _pod({"a": "1", "b": "1"}), KUBECTL)
    patch = {"metadata": {"annotations": {"a": "2", "b": "1"}}}
    patched = await _send(server, "PATCH", f"{PODS}/p", patch, "anything/1.0", fieldManager="vc-scheduler")
    owners = _owners(patched)
    assert owners["vc-scheduler"] == {("metadata", "annotations", "a")}
    assert ("metadata", "annotations", "b") in owners["kubectl-create"]
    assert ("metadata", "annotations", "a") not in owners["kubectl-create"]
    again = await _send(server, "PATCH", f"{PODS}/p", {"metadata": {"annotations": {"b": "1"}}}, "kubectl-annotate/1")
    assert "kubectl-annotate" not in _owners(again), "a write that changes nothing owns nothing"


async def test_without_a_field_manager_the_user_agent_up_to_its_first_slash_names_the_writer(server):
    await _send(server, "POST", PODS, _pod({}), KUBECTL)
    patched = await _send(server, "PATCH", f"{PODS}/p", {"metadata": {"annotations": {"x": "1"}}}, SCHEDULER)
    assert _owners(patched)["vc-scheduler"] == {("metadata", "annotations", "x")}
    assert manager_of(None, "a\x00b\x7fc/d") == "abc", "unprintable characters are left out"
    assert manager_of(None, "é" * 100) == "é" * 64, "cut to 128 bytes"
    assert manager_of("given", SCHEDULER) == "given"


async def test_a_removed_field_leaves_every_manager_and_an_empty_entry_goes(server):
    await _send(server, "POST", PODS, _pod({}), KUBECTL)
    await _send(server, "PATCH", f"{PODS}/p", {"metadata": {"annotations": {"x": "1"}}}, SCHEDULER)
    removed = await _send(server, "PATCH", f"{PODS}/p", {"metadata": {"annotations": {"x": None}}}, "kubectl-edit/1")
    assert set(_owners(removed)) == {"kubectl-create"}


async def test_managed_fields_a_request_sets_replace_the_record_and_an_empty_list_is_ignored(server):
    """The record is the clients' word: a request may set any manager's name there (why a policy must guard it)."""
    await _send(server, "POST", PODS, _pod({"x": "1"}), KUBECTL)
    claimed = [{"manager": "vc-scheduler", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1"}]
    claimed[0]["fieldsV1"] = encode({("metadata", "annotations", "x")})
    forged = await _send(server, "PATCH", f"{PODS}/p", {"metadata": {"managedFields": claimed}}, "kubectl-patch/1")
    assert set(_owners(forged)) == {"vc-scheduler"}
    ignored = await _send(server, "PATCH", f"{PODS}/p", {"metadata": {"managedFields": []}}, "kubectl-patch/1")
    assert set(_owners(ignored)) == {"vc-scheduler"}
    cleared = await _send(server, "PATCH", f"{PODS}/p", {"metadata": {"managedFields": [{}]}}, "kubectl-patch/1")
    assert "managedFields" not in cleared["metadata"]


async def test_a_status_write_is_recorded_for_the_status_subresource_only(server):
    await _send(server, "POST", PODS, _pod({}), KUBECTL)
    status = await _send(server, "PATCH", f"{PODS}/p/status", {"status": {"phase": "Running"}}, "kubelet/v1.35.0")
    entry = next(entry for entry in status["metadata"]["managedFields"] if entry["manager"] == "kubelet")
    assert entry["subresource"] == "status" and decode(entry["fieldsV1"]) == {("status", "phase")}


def test_tests_write_as_a_named_manager_through_the_same_path() -> None:
    server = ApiServerStandIn()
    server.add_pod("ml", "p", "node")
    server.patch("pods", "p", "ml", {"metadata": {"annotations": {"x": "1"}}}, Writer("vc-scheduler", "v1"))
    stored = server.get("pods", "p", "ml")
    assert stored is not None and _owners(stored) == {"vc-scheduler": {("metadata", "annotations", "x")}}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=20,
)
PATHS = st.sets(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=4).map(tuple), max_size=8)


@given(JSON, JSON, JSON)
def test_any_request_and_any_record_are_taken_without_error(before: Any, after: Any, given_fields: Any) -> None:
    """What a client sends (its object, its managedFields) is another process's writing: never a crash."""
    old = {"metadata": {"managedFields": given_fields}, "spec": before}
    new: dict[str, Any] = {"metadata": {}, "spec": after}
    record_write(old, new, Writer("w", "v1"), "2026-01-01T00:00:00Z", given_fields)
    for entry in new["metadata"].get("managedFields", []):
        assert isinstance(entry, dict)


@given(PATHS)
def test_fields_v1_says_exactly_the_paths_it_was_made_of(paths: set[tuple[str, ...]]) -> None:
    assert decode(encode(paths)) == paths
