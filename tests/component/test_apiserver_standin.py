"""The API server stand-in answers raw HTTP as kube-apiserver does: paths, status objects, selectors, watches."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from helpers.waits import stays, until
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.standins.apiserver import ApiServerStandIn, field_matcher, label_matcher, merge_patch

HEADERS = {"Authorization": "Bearer standin-token"}
MERGE = {**HEADERS, "Content-Type": "application/merge-patch+json"}
STRATEGIC = {**HEADERS, "Content-Type": "application/strategic-merge-patch+json"}


@pytest.fixture
async def server():
    async with ApiServerStandIn() as standin:
        yield standin


@pytest.fixture
async def http(server):
    async with aiohttp.ClientSession(server.url, headers=HEADERS) as session:
        yield session


async def _json(response: aiohttp.ClientResponse) -> dict:
    assert response.headers["Content-Type"] == "application/json"
    return json.loads(await response.read())


def _config_map(name: str, data: dict | None = None, **metadata) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **metadata}, "data": data or {}}


async def test_no_token_is_401_status(server):
    async with aiohttp.ClientSession(server.url) as anonymous, anonymous.get("/api/v1/nodes") as response:
        assert response.status == 401
        assert await _json(response) == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }


async def test_config_map_lifecycle(http, server):
    path = "/api/v1/namespaces/ns/configmaps"
    async with http.get(f"{path}/cm") as response:
        assert response.status == 404
        status = await _json(response)
        assert (status["kind"], status["reason"], status["code"]) == ("Status", "NotFound", 404)
        assert status["message"] == 'configmaps "cm" not found'
        assert status["details"] == {"name": "cm", "group": "", "kind": "configmaps"}
    async with http.post(path, json=_config_map("cm", {"a": "1"})) as response:
        assert response.status == 201
        created = await _json(response)
    assert created["metadata"]["namespace"] == "ns" and created["metadata"]["uid"]
    assert created["metadata"]["resourceVersion"] == "1" and created["metadata"]["creationTimestamp"].endswith("Z")
    async with http.post(path, json=_config_map("cm")) as response:
        assert response.status == 409
        assert (await _json(response))["reason"] == "AlreadyExists"

    stale = _config_map("cm", {"a": "2"}, resourceVersion="0")
    async with http.put(f"{path}/cm", json=stale) as response:
        assert response.status == 409
        conflict = await _json(response)
        assert conflict["reason"] == "Conflict" and "the object has been modified" in conflict["message"]
    fresh = _config_map("cm", {"a": "2"}, resourceVersion="1")
    async with http.put(f"{path}/cm", json=fresh) as response:
        replaced = await _json(response)
    assert replaced["data"] == {"a": "2"} and replaced["metadata"]["resourceVersion"] == "2"
    assert replaced["metadata"]["uid"] == created["metadata"]["uid"]
    async with http.put(f"{path}/cm", json=_config_map("cm", {"a": "3"})) as response:  # no version: unconditional
        assert (await _json(response))["data"] == {"a": "3"}

    async with http.patch(f"{path}/cm", data=json.dumps({"data": {"b": "x", "a": None}}), headers=MERGE) as response:
        assert (await _json(response))["data"] == {"b": "x"}
    async with http.patch(
        f"{path}/cm", data="[]", headers={**HEADERS, "Content-Type": "application/json-patch+json"}
    ) as r:
        assert r.status == 415 and (await _json(r))["reason"] == "UnsupportedMediaType"

    async with http.delete(f"{path}/cm") as response:
        assert response.status == 200 and (await _json(response))["metadata"]["name"] == "cm"
    async with http.delete(f"{path}/cm") as response:
        assert response.status == 404
    assert [r.method for r in server.requests] == [
        "GET",
        "POST",
        "POST",
        "PUT",
        "PUT",
        "PUT",
        "PATCH",
        "PATCH",
        "DELETE",
        "DELETE",
    ]
    assert server.requests[6].content_type == "application/merge-patch+json"
    assert server.requests[6].body == {"data": {"b": "x", "a": None}}


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a" * 254, "must be no more than 253 characters"),
        ("Node-1", "a lowercase RFC 1123 subdomain"),
        ("node-.x", "a lowercase RFC 1123 subdomain"),
    ],
)
async def test_a_name_that_is_not_a_dns_subdomain_is_invalid_as_kube_apiserver_answers(http, server, name, why):
    async with http.post("/api/v1/namespaces/default/events", json={"metadata": {"name": name}}) as response:
        status = await _json(response)
    assert response.status == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith(f'Event "{name}" is invalid: metadata.name: Invalid value: "{name}": {why}')
    assert status["details"]["causes"][0]["field"] == "metadata.name"
    assert server.objects("events") == []
    longest = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
    async with http.post("/api/v1/namespaces/default/events", json={"metadata": {"name": longest}}) as response:
        assert response.status == 201


async def test_bad_requests(http):
    async with http.post("/api/v1/namespaces/ns/configmaps", json={"metadata": {}}) as response:
        assert response.status == 422 and (await _json(response))["reason"] == "Invalid"
    async with http.put("/api/v1/namespaces/ns/configmaps/a", json=_config_map("b")) as response:
        assert response.status == 404  # no such object to replace
    async with http.get("/api/v1/widgets") as response:
        assert response.status == 404
    async with http.get("/apis/example.com/v1/things") as response:
        assert response.status == 404
    async with http.get("/api/v1/pods", params={"fieldSelector": "spec.schedulerName=x"}) as response:
        assert response.status == 400
        assert (await _json(response))["message"] == 'field label not supported: "spec.schedulerName"'


async def test_pod_selectors_and_annotation_patches(http, server):
    server.add_pod("a", "p1", "node-1", labels={"app": "x", "tier": "gpu"})
    server.add_pod("b", "p2", "node-1", phase="Pending", labels={"app": "y"})
    server.add_pod("a", "p3", "node-2", labels={"app": "x"})

    async def names(path: str, **params: str) -> list[str]:
        async with http.get(path, params=params) as response:
            listing = await _json(response)
        assert listing["kind"] == "PodList" and listing["metadata"]["resourceVersion"] == str(server.resource_version)
        return [item["metadata"]["name"] for item in listing["items"]]

    assert await names("/api/v1/pods", fieldSelector="spec.nodeName=node-1") == ["p1", "p2"]
    assert await names("/api/v1/pods", fieldSelector="spec.nodeName=node-1,status.phase=Running") == ["p1"]
    assert await names("/api/v1/pods", fieldSelector="spec.nodeName==node-1,status.phase!=Running") == ["p2"]
    assert await names("/api/v1/namespaces/a/pods") == ["p1", "p3"]
    assert await names("/api/v1/pods", labelSelector="app=x,tier") == ["p1"]
    assert await names("/api/v1/pods", labelSelector="app in (x, y),!tier") == ["p3", "p2"]
    assert await names("/api/v1/pods", labelSelector="app notin (x)") == ["p2"]

    pod = "/api/v1/namespaces/a/pods/p1"
    async with http.patch(pod, data=json.dumps({"metadata": {"annotations": {"k1": "v1"}}}), headers=STRATEGIC) as r:
        assert (await _json(r))["metadata"]["annotations"] == {"k1": "v1"}
    async with http.patch(pod, data=json.dumps({"metadata": {"annotations": {"k2": "v2"}}}), headers=MERGE) as r:
        patched = await _json(r)
    assert patched["metadata"]["annotations"] == {"k1": "v1", "k2": "v2"}
    assert patched["metadata"]["labels"] == {"app": "x", "tier": "gpu"} and patched["spec"]["nodeName"] == "node-1"


async def test_resource_api_versions_share_one_store(http):
    body = {"metadata": {"name": "s1"}, "spec": {"nodeName": "node-1", "driver": "gpu.iluvatar.com"}}
    async with http.post("/apis/resource.k8s.io/v1beta1/resourceslices", json=body) as response:
        assert response.status == 201
    for version in ("v1", "v1beta1", "v1beta2"):
        url = f"/apis/resource.k8s.io/{version}/resourceslices"
        async with http.get(url, params={"fieldSelector": "spec.nodeName=node-1"}) as response:
            listing = await _json(response)
        assert listing["apiVersion"] == f"resource.k8s.io/{version}"
        assert [(i["apiVersion"], i["metadata"]["name"]) for i in listing["items"]] == [
            (f"resource.k8s.io/{version}", "s1")
        ]
    async with http.get("/apis/resource.k8s.io/v1/resourceslices", params={"fieldSelector": "spec.nodeName=x"}) as r:
        assert (await _json(r))["items"] == []
    claims = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims"
    async with http.post(claims, json={"metadata": {"name": "c"}, "spec": {}}) as response:
        assert (await _json(response))["metadata"]["namespace"] == "team"
    async with http.get("/apis/resource.k8s.io/v1beta2/namespaces/team/resourceclaims/c") as response:
        assert response.status == 200
    async with http.get("/apis/resource.k8s.io/v1/namespaces/team/resourceslices") as response:
        assert response.status == 404  # cluster-scoped: no namespaced path


async def test_one_resource_version_counter_across_kinds(server):
    first = server.add_node("n")
    second = server.add_pod("ns", "p", "n")
    third = server.set_node_labels("n", {"a": "b"})
    versions = [int(obj["metadata"]["resourceVersion"]) for obj in (first, second, third)]
    assert versions == [1, 2, 3] == sorted(versions)
    assert third["metadata"]["uid"] == first["metadata"]["uid"]


class _Watch:
    """Reads a watch stream line by line."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self) -> dict:
        async with asyncio.timeout(5):
            line = await self.response.content.readline()
        assert line.endswith(b"\n"), line
        return json.loads(line)

    async def ended(self) -> bool:
        async with asyncio.timeout(5):
            return await self.response.content.read() == b""


async def test_watch_lists_then_streams_changes(http, server):
    server.add_node("n1", {"a": "1"})
    server.add_node("n2")
    params = {"watch": "true", "fieldSelector": "metadata.name=n1"}
    async with http.get("/api/v1/nodes", params=params) as response:
        assert response.headers["Transfer-Encoding"] == "chunked"
        watch = _Watch(response)
        added = await watch.next()
        assert added["type"] == "ADDED" and added["object"]["metadata"]["labels"] == {"a": "1"}
        server.set_node_labels("n2", {"ignored": "yes"})
        server.set_node_labels("n1", {"a": "2"})
        modified = await watch.next()
        assert modified["type"] == "MODIFIED" and modified["object"]["metadata"]["labels"] == {"a": "2"}
        assert modified["object"]["metadata"]["resourceVersion"] == str(server.resource_version)
        server.bookmark()
        bookmark = await watch.next()
        assert bookmark == {
            "type": "BOOKMARK",
            "object": {
                "kind": "Node",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(server.resource_version)},
            },
        }
        server.drop_watches()
        assert await watch.ended()


async def test_watch_resumes_after_a_version_and_410_when_too_old(http, server):
    server.add_node("n1", {"a": "1"})  # version 1
    server.set_node_labels("n1", {"a": "2"})  # 2
    server.set_node_labels("n1", {"a": "3"})  # 3
    async with http.get("/api/v1/nodes/n1", params={"watch": "true", "resourceVersion": "2"}) as response:
        event = await _Watch(response).next()
        assert event["type"] == "MODIFIED" and event["object"]["metadata"]["resourceVersion"] == "3"
    server.compact()
    async with http.get("/api/v1/nodes", params={"watch": "true", "resourceVersion": "2"}) as response:
        assert response.status == 200  # as kube-apiserver: the error comes as an event
        watch = _Watch(response)
        error = await watch.next()
        assert error["type"] == "ERROR"
        assert (error["object"]["kind"], error["object"]["code"], error["object"]["reason"]) == (
            "Status",
            410,
            "Expired",
        )
        assert await watch.ended()
    async with http.get("/api/v1/nodes", params={"watch": "true", "resourceVersion": "3"}) as response:
        watch = _Watch(response)
        server.set_node_labels("n1", {"a": "4"})
        assert (await watch.next())["object"]["metadata"]["resourceVersion"] == "4"


async def test_watch_history_limit_expires_old_versions(http):
    server = ApiServerStandIn(history=2)
    async with server, aiohttp.ClientSession(server.url, headers=HEADERS) as session:
        server.add_node("n")
        for value in "abc":
            server.set_node_labels("n", {"v": value})
        async with session.get("/api/v1/nodes", params={"watch": "true", "resourceVersion": "1"}) as response:
            assert (await _Watch(response).next())["object"]["code"] == 410
        async with session.get("/api/v1/nodes", params={"watch": "true", "resourceVersion": "2"}) as response:
            assert (await _Watch(response).next())["object"]["metadata"]["labels"] == {"v": "b"}


async def test_hostile_watches_are_answered_410_or_ended_at_once(http, server):
    server.add_node("n1", {"a": "1"})
    server.watches_end = "expired"
    async with http.get("/api/v1/nodes", params={"watch": "true", "resourceVersion": "1"}) as response:
        watch = _Watch(response)
        error = await watch.next()
        assert (error["type"], error["object"]["code"], error["object"]["reason"]) == ("ERROR", 410, "Expired")
        assert await watch.ended()
    server.watches_end = "at once"
    async with http.get("/api/v1/nodes", params={"watch": "true"}) as response:
        assert response.status == 200 and await _Watch(response).ended()  # not even the ADDED of n1
    server.watches_end = None
    async with http.get("/api/v1/nodes", params={"watch": "true"}) as response:
        assert (await _Watch(response).next())["type"] == "ADDED"


async def test_watching_returns_once_a_watch_of_that_kind_is_open_and_a_change_made_then_reaches_it(http, server):
    waiting = asyncio.create_task(server.watching("nodes"))
    async with http.get("/api/v1/pods", params={"watch": "true"}):
        assert server.open_watches("pods") == 1
        assert not waiting.done(), "a watch of another kind"
    async with http.get("/api/v1/nodes", params={"watch": "true"}) as response:
        await waiting
        server.add_node("n1")
        assert (await _Watch(response).next())["object"]["metadata"]["name"] == "n1"
        with pytest.raises(TimeoutError, match=r"not 2 open watch\(es\) of nodes within 0.1s \(open: \[.*'nodes'"):
            await server.watching("nodes", count=2, timeout=0.1)
        server.drop_watches()
        assert server.open_watches("nodes") == 0, "a dropped watch counts as closed at once"
        assert await _Watch(response).ended()


async def test_a_watch_that_ends_at_once_is_never_open(http, server):
    server.watches_end = "at once"
    async with http.get("/api/v1/nodes", params={"watch": "true"}) as response:
        assert await _Watch(response).ended()
    with pytest.raises(TimeoutError, match=r"\(open: none\)"):
        await server.watching("nodes", timeout=0.1)


async def test_watch_timeout_seconds_ends_the_stream(http, server):
    params = {"watch": "true", "timeoutSeconds": "1"}
    async with http.get("/api/v1/nodes", params=params) as response:
        async with asyncio.timeout(5):
            assert await response.content.read() == b""


async def test_unavailable_and_refused(http, server):
    server.unavailable = True
    async with http.get("/api/v1/nodes") as response:
        assert response.status == 503 and (await _json(response))["reason"] == "ServiceUnavailable"
    server.unavailable = False
    await server.refuse()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession(server.url, headers=HEADERS) as fresh, fresh.get("/api/v1/nodes"):
            pass
    await server.accept()
    async with aiohttp.ClientSession(server.url, headers=HEADERS) as fresh, fresh.get("/api/v1/nodes") as response:
        assert response.status == 200


async def test_refuse_cuts_open_watches(http, server):
    async with http.get("/api/v1/nodes", params={"watch": "true"}) as response:
        await server.refuse()
        with pytest.raises((aiohttp.ClientError, ConnectionError)):
            async with asyncio.timeout(5):
                while await response.content.readline():
                    pass
                await response.content.read()
                raise ConnectionError("stream ended")


def test_kubeconfig_points_at_the_server(tmp_path):
    server = ApiServerStandIn()
    server.port = 6443
    config = json.loads(server.write_kubeconfig(tmp_path / "config", namespace="ix").read_text())
    assert config["clusters"][0]["cluster"] == {"server": "http://127.0.0.1:6443"}
    assert config["users"][0]["user"] == {"token": "standin-token"}
    assert config["contexts"][0]["context"]["namespace"] == "ix"
    assert config["current-context"] == "standin"


# ---- pure functions -------------------------------------------------------------------------


def test_selectors():
    pod = {"metadata": {"name": "p", "labels": {"app": "x"}}, "spec": {"nodeName": "n"}, "status": {"phase": "Running"}}
    assert field_matcher("spec.nodeName=n,status.phase=Running")(pod)
    assert not field_matcher("spec.nodeName=m")(pod)
    assert field_matcher("")(pod) and label_matcher("")(pod)
    assert label_matcher("app==x")(pod) and label_matcher("app!=y")(pod) and label_matcher("!tier")(pod)
    assert not label_matcher("app in (y,z)")(pod)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=10,
)
objects = st.dictionaries(st.text(max_size=3), json_values, max_size=4)


@given(target=objects, patch=objects)
def test_merge_patch_follows_rfc_7386(target, patch):
    result = merge_patch(target, patch)
    for key, value in patch.items():
        if value is None:
            assert key not in result
        elif not isinstance(value, dict):
            assert result[key] == value
    for key, value in target.items():
        if key not in patch:
            assert result[key] == value
    assert merge_patch(target, {}) == target


async def test_the_garbage_collector_deletes_what_a_gone_owner_owned(server):
    node = server.add_node("n1")
    owner = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": node["metadata"]["uid"], "controller": True}
    other = {"apiVersion": "v1", "kind": "Node", "name": "n2", "uid": server.add_node("n2")["metadata"]["uid"]}
    elsewhere = {"apiVersion": "example.com/v1", "kind": "Widget", "name": "w", "uid": "u"}
    for name, owners in (("owned", [owner]), ("shared", [owner, other]), ("foreign", [elsewhere])):
        server.put("configmaps", _config_map(name, namespace="ns", ownerReferences=owners))
    server.put("configmaps", _config_map("stale", namespace="ns", ownerReferences=[{**owner, "uid": "not-it"}]))
    await until(
        lambda: server.get("configmaps", "stale", "ns") is None,
        timeout=5,
        message="an owner of that name, but another UID",
    )
    assert server.get("configmaps", "owned", "ns") is not None
    server.delete("nodes", "n1")
    server.add_node("n1")  # the same name, a new UID
    await until(
        lambda: server.get("configmaps", "owned", "ns") is None,
        timeout=5,
        message='server.get("configmaps", "owned", "ns") is None',
    )
    shared = server.get("configmaps", "shared", "ns")
    assert shared is not None and shared["metadata"]["ownerReferences"] == [other]  # the gone owner taken out
    assert server.get("configmaps", "foreign", "ns") is not None  # a kind it does not know: left alone
    server.garbage_collector = False
    server.delete("nodes", "n2")
    await stays(
        lambda: server.get("configmaps", "shared", "ns") is not None,
        for_=server.gc_delay * 4,
        message='server.get("configmaps", "shared", "ns") is not None',
    )


async def test_slow_down_holds_the_next_matching_requests_only(http, server):
    server.slow_down("GET", "/configmaps/slow", 0.3)
    loop = asyncio.get_running_loop()
    for expected in (True, False):
        started = loop.time()
        async with http.get("/api/v1/namespaces/ns/configmaps/slow") as response:
            assert response.status == 404
        assert (loop.time() - started >= 0.3) is expected
