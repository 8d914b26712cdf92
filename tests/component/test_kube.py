"""The Kubernetes API shell (settings, the Kube facade, errors), driving the real client library against the API server
stand-in."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from helpers.host_tools import missing

from ix_device_plugin.apiserver.client import Kube, connect
from ix_device_plugin.apiserver.errors import KubeAlreadyExists, KubeConflict, KubeError, KubeInvalid, KubeNotFound
from ix_device_plugin.apiserver.objects import CONFIG_MAP, RESOURCE_CLAIM, RESOURCE_SLICE, ContainerLimits, ObjectKind
from ix_device_plugin.apiserver.settings import KubeConfigError, KubeSettings, settings_from
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.standins.apiserver import ApiServerStandIn

NODE = "gpu-node-1"
NS = "kube-system"
FEATURE = "flags.usevolcano"
LABEL = "iluvatar.com/device-plugin.config"


@pytest.fixture
def kubeconfig(apiserver, tmp_path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def kube(kubeconfig):
    settings = settings_from({"NODE_NAME": NODE, "KUBECONFIG": str(kubeconfig)}, None, FEATURE)
    client = await connect(settings)
    yield client
    await client.close()


async def _kube_with_timeout(kubeconfig: Path, timeout: float) -> Kube:
    settings = settings_from({"NODE_NAME": NODE}, str(kubeconfig), FEATURE)
    return await connect(KubeSettings(settings.node_name, settings.namespace, settings.kubeconfig, timeout=timeout))


# ---- connecting ---------------------------------------------------------------------------


def _service_account(directory: Path, namespace: str = "ix-system") -> Path:
    directory.mkdir(exist_ok=True)
    (directory / "token").write_text("in-cluster-token\n")
    (directory / "ca.crt").write_text("not a real certificate\n")
    (directory / "namespace").write_text(namespace)
    return directory


async def test_connect_in_cluster_with_a_bad_ca_names_it(tmp_path):
    account = _service_account(tmp_path / "sa")
    env = {"NODE_NAME": NODE, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}
    settings = settings_from(env, None, FEATURE, service_account_dir=account)
    expected = rf"^cannot use in-cluster service account \(https://127.0.0.1:1, CA {account}/ca.crt\): "
    with pytest.raises(KubeConfigError, match=expected):
        await connect(settings)


@pytest.fixture
def certificate(tmp_path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made by openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        missing("no openssl to make a certificate for the https API server: apt-get install openssl")
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key), "-out", str(cert)]
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run([openssl, *request, *subject], check=True, capture_output=True)
    return cert, key


async def test_in_cluster_over_https_with_a_rotated_token(tmp_path, certificate):
    async with ApiServerStandIn(token="first", tls=certificate) as server:
        server.add_node(NODE, {LABEL: "in-cluster"})
        account = tmp_path / "sa"
        account.mkdir()
        (account / "token").write_text("first")
        (account / "ca.crt").write_bytes(certificate[0].read_bytes())
        (account / "namespace").write_text("ix-system")
        env = {"NODE_NAME": NODE, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
        kube = await connect(settings_from(env, None, FEATURE, service_account_dir=account))
        assert await kube.get_node(NODE) == {LABEL: "in-cluster"}
        # The kubelet rotates the projected token: the next request that is refused reads the file again.
        server.token = "second"
        (account / "token").write_text("second")
        assert await kube.get_node(NODE) == {LABEL: "in-cluster"}
        await kube.create_config_map(kube.namespace, "reset", {})
        assert server.requests[-1].path == "/api/v1/namespaces/ix-system/configmaps"
        await kube.close()


_NO_USER = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: x, context: {cluster: c}}]
current-context: x
"""


@pytest.mark.parametrize(
    "text",
    ["{not yaml: [", "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n", "- a list\n", _NO_USER],
)
async def test_a_broken_kubeconfig_is_a_config_error(tmp_path, text):
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    settings = settings_from({"NODE_NAME": NODE}, str(path), FEATURE)
    with pytest.raises(KubeConfigError, match=rf"(^kubeconfig {path}: )|(^cannot use kubeconfig {path}: )"):
        await connect(settings)


# ---- ConfigMaps -----------------------------------------------------------------------------


async def test_config_map_missing_is_none(kube, apiserver):
    assert await kube.get_config_map(NS, "ix-device-info-cm-gpu-node-1") is None
    assert apiserver.requests[-1].path == "/api/v1/namespaces/kube-system/configmaps/ix-device-info-cm-gpu-node-1"


async def test_config_map_create_get_replace_patch(kube, apiserver):
    created = await kube.create_config_map(NS, "reset", {"gpu0": "idle"})
    assert created.namespace == NS and created.name == "reset" and created.data == {"gpu0": "idle"}
    assert created.resource_version == str(apiserver.resource_version)

    read = await kube.get_config_map(NS, "reset")
    assert read == created

    replaced = await kube.replace_config_map(NS, "reset", {"gpu0": "resetting"}, read.resource_version)
    assert replaced.data == {"gpu0": "resetting"}
    assert int(replaced.resource_version) > int(read.resource_version)
    assert apiserver.requests[-1].method == "PUT"
    assert apiserver.requests[-1].body["metadata"]["resourceVersion"] == read.resource_version

    patched = await kube.patch_config_map_data(NS, "reset", {"gpu1": "idle"})
    assert patched.data == {"gpu0": "resetting", "gpu1": "idle"}
    removed = await kube.patch_config_map_data(NS, "reset", {"gpu0": None})
    assert removed.data == {"gpu1": "idle"}
    assert apiserver.requests[-1].content_type == "application/merge-patch+json"
    assert apiserver.get("configmaps", "reset", NS)["data"] == {"gpu1": "idle"}


async def test_config_map_create_twice_is_already_exists(kube):
    await kube.create_config_map(NS, "reset", {})
    with pytest.raises(KubeAlreadyExists) as caught:
        await kube.create_config_map(NS, "reset", {})
    assert caught.value.status == 409 and not caught.value.transient
    assert (
        str(caught.value)
        == 'create configmap kube-system/reset: HTTP 409 AlreadyExists: configmaps "reset" already exists'
    )


async def test_replace_with_a_stale_resource_version_is_a_conflict(kube):
    first = await kube.create_config_map(NS, "reset", {"gpu0": "idle"})
    await kube.replace_config_map(NS, "reset", {"gpu0": "resetting"}, first.resource_version)
    with pytest.raises(KubeConflict) as caught:
        await kube.replace_config_map(NS, "reset", {"gpu0": "done"}, first.resource_version)
    assert caught.value.status == 409 and caught.value.reason == "Conflict"
    assert str(caught.value).startswith("replace configmap kube-system/reset: HTTP 409 Conflict: ")
    assert (await kube.get_config_map(NS, "reset")).data == {"gpu0": "resetting"}


async def test_patch_or_replace_of_a_missing_config_map_is_not_found(kube):
    with pytest.raises(KubeNotFound, match=r"^patch configmap kube-system/absent: HTTP 404 NotFound"):
        await kube.patch_config_map_data(NS, "absent", {"a": "b"})
    with pytest.raises(KubeNotFound, match=r"^replace configmap kube-system/absent: HTTP 404 NotFound"):
        await kube.replace_config_map(NS, "absent", {}, "1")


# ---- pods -----------------------------------------------------------------------------------


def _seed_pods(apiserver: ApiServerStandIn) -> None:
    apiserver.add_pod(
        "team-a",
        "train",
        NODE,
        labels={"app": "train"},
        annotations={"volcano.sh/devices": "0"},
        limits={"main": {"iluvatar.com/gpu": "2", "cpu": "4"}, "sidecar": {"cpu": "1"}},
    )
    apiserver.add_pod("team-b", "serve", NODE, phase="Pending", labels={"app": "serve"})
    apiserver.add_pod("team-a", "elsewhere", "gpu-node-2", labels={"app": "train"})


async def test_list_pods_of_the_node_across_namespaces(kube, apiserver):
    _seed_pods(apiserver)
    pods = await kube.list_pods(field_selector={"spec.nodeName": NODE})
    assert [(pod.namespace, pod.name) for pod in pods] == [("team-a", "train"), ("team-b", "serve")]
    assert apiserver.requests[-1].path == "/api/v1/pods"
    assert apiserver.requests[-1].query["fieldSelector"] == f"spec.nodeName={NODE}"

    train = pods[0]
    stored = apiserver.get("pods", "train", "team-a")
    assert train.uid == stored["metadata"]["uid"] and train.uid
    assert train.annotations == {"volcano.sh/devices": "0"}
    assert train.phase == "Running" and train.node_name == NODE
    assert isinstance(train.created, datetime) and train.created.tzinfo is not None
    assert train.containers == (
        ContainerLimits("main", {"iluvatar.com/gpu": "2", "cpu": "4"}),
        ContainerLimits("sidecar", {"cpu": "1"}),
    )
    assert train.resource_version == stored["metadata"]["resourceVersion"]


async def test_list_pods_by_namespace_phase_and_labels(kube, apiserver):
    _seed_pods(apiserver)
    pending = await kube.list_pods(field_selector={"spec.nodeName": NODE, "status.phase": "Pending"})
    assert [pod.name for pod in pending] == ["serve"]
    assert apiserver.requests[-1].query["fieldSelector"] == f"spec.nodeName={NODE},status.phase=Pending"
    in_a = await kube.list_pods("team-a", label_selector={"app": "train"})
    assert [pod.name for pod in in_a] == ["elsewhere", "train"]
    assert apiserver.requests[-1].path == "/api/v1/namespaces/team-a/pods"
    assert await kube.list_pods("team-b", label_selector={"app": "train"}) == []


async def test_patch_pod_annotations_merges(kube, apiserver):
    _seed_pods(apiserver)
    patched = await kube.patch_pod_annotations("team-a", "train", {"iluvatar.com/real-alloc": "0,1"})
    assert patched.annotations == {"volcano.sh/devices": "0", "iluvatar.com/real-alloc": "0,1"}
    request = apiserver.requests[-1]
    assert (request.method, request.path, request.content_type) == (
        "PATCH",
        "/api/v1/namespaces/team-a/pods/train",
        "application/merge-patch+json",
    )
    assert request.body == {"metadata": {"annotations": {"iluvatar.com/real-alloc": "0,1"}}}
    removed = await kube.patch_pod_annotations("team-a", "train", {"volcano.sh/devices": None})
    assert removed.annotations == {"iluvatar.com/real-alloc": "0,1"}
    with pytest.raises(KubeNotFound, match=r"^patch pod team-a/gone: HTTP 404"):
        await kube.patch_pod_annotations("team-a", "gone", {"a": "b"})


# ---- nodes ----------------------------------------------------------------------------------


async def test_get_node_labels(kube, apiserver):
    assert await kube.get_node(NODE) == {"kubernetes.io/hostname": NODE}
    with pytest.raises(KubeNotFound, match=r"^get node absent: HTTP 404"):
        await kube.get_node("absent")


# ---- failures -------------------------------------------------------------------------------


async def test_unavailable_server_is_a_transient_error_naming_the_call(kube, apiserver):
    apiserver.unavailable = True
    with pytest.raises(KubeError) as caught:
        await kube.get_config_map(NS, "reset")
    assert str(caught.value) == (
        "get configmap kube-system/reset: HTTP 503 ServiceUnavailable: "
        "the server is currently unable to handle the request"
    )
    assert caught.value.status == 503 and caught.value.transient


async def test_refused_connection_is_a_transient_error(kube, apiserver):
    await apiserver.refuse()
    with pytest.raises(KubeError) as caught:
        await kube.list_pods(field_selector={"spec.nodeName": NODE})
    assert str(caught.value).startswith(f"list pods in every namespace: cannot reach the API server at {apiserver.url}")
    assert caught.value.status is None and caught.value.transient


async def test_a_slow_server_hits_the_call_deadline(kubeconfig, apiserver):
    kube = await _kube_with_timeout(kubeconfig, 0.2)
    apiserver.delay = 1.0
    with pytest.raises(KubeError, match=r"^get node gpu-node-1: no answer from the API server within 0.2s$"):
        await kube.get_node(NODE)
    await kube.close()


async def test_a_wrong_token_is_unauthorized(tmp_path, apiserver):
    path = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    config = json.loads(path.read_text())
    config["users"][0]["user"]["token"] = "wrong"
    path.write_text(json.dumps(config))
    kube = await connect(settings_from({"NODE_NAME": NODE}, str(path), FEATURE))
    with pytest.raises(KubeError, match=r"^get node gpu-node-1: HTTP 401 Unauthorized") as caught:
        await kube.get_node(NODE)
    assert not caught.value.transient
    await kube.close()


# ---- custom objects (DRA) -------------------------------------------------------------------


def _slice(name: str, node: str) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"driver": "gpu.iluvatar.com", "nodeName": node, "pool": {"name": node, "generation": 1}},
    }


async def test_resource_slices_create_list_replace_delete(kube, apiserver):
    created = await kube.create_object(RESOURCE_SLICE, _slice("gpu-node-1-gpu", NODE))
    assert created["apiVersion"] == "resource.k8s.io/v1" and created["kind"] == "ResourceSlice"
    assert created["metadata"]["resourceVersion"] == str(apiserver.resource_version)
    await kube.create_object(RESOURCE_SLICE, _slice("gpu-node-2-gpu", "gpu-node-2"))
    assert apiserver.requests[-1].path == "/apis/resource.k8s.io/v1/resourceslices"

    mine = await kube.list_objects(RESOURCE_SLICE, field_selector={"spec.nodeName": NODE})
    assert [obj["metadata"]["name"] for obj in mine] == ["gpu-node-1-gpu"]

    changed = {**created, "spec": {**created["spec"], "pool": {"name": NODE, "generation": 2}}}
    replaced = await kube.replace_object(RESOURCE_SLICE, changed)
    assert replaced["spec"]["pool"]["generation"] == 2
    with pytest.raises(KubeConflict, match=r"^replace resourceslice gpu-node-1-gpu: HTTP 409 Conflict"):
        await kube.replace_object(RESOURCE_SLICE, changed)  # still at the version before the replace
    with pytest.raises(KubeAlreadyExists):
        await kube.create_object(RESOURCE_SLICE, _slice("gpu-node-1-gpu", NODE))

    await kube.delete_object(RESOURCE_SLICE, "gpu-node-1-gpu")
    assert apiserver.requests[-1].method == "DELETE"
    assert await kube.get_object(RESOURCE_SLICE, "gpu-node-1-gpu") is None
    with pytest.raises(KubeNotFound, match=r"^delete resourceslice gpu-node-1-gpu: HTTP 404"):
        await kube.delete_object(RESOURCE_SLICE, "gpu-node-1-gpu")


async def test_a_422_names_the_fields_the_server_refused(kube, apiserver):
    apiserver.counters_refused = True
    body = _slice("gpu-node-1-gpu", NODE)
    body["spec"]["devices"] = [{"name": "gpu-0"}, {"name": "gpu-1", "consumesCounters": [{"counterSet": "b"}]}]
    with pytest.raises(KubeInvalid, match=r"^create resourceslice gpu-node-1-gpu: HTTP 422 Invalid: ") as refused:
        await kube.create_object(RESOURCE_SLICE, body)
    assert refused.value.status == 422 and refused.value.fields == ("spec.devices[1].consumesCounters",)
    assert refused.value.names("consumesCounters") and not refused.value.names("attributes")
    assert refused.value.causes[0].reason == "FieldValueForbidden"
    apiserver.refuse_writes("resourceslices", "metadata.annotations", "Invalid value: no")
    with pytest.raises(KubeInvalid) as other:
        await kube.create_object(RESOURCE_SLICE, _slice("x", NODE))
    assert other.value.fields == ("metadata.annotations",) and "metadata.annotations: Invalid value: no" in str(
        other.value
    )
    assert isinstance(other.value, KubeError) and not other.value.transient


async def test_a_dry_run_answers_what_would_be_stored_and_stores_nothing(kube, apiserver):
    apiserver.shared_counters = False
    body = _slice("ignored", NODE)
    body["metadata"] = {"generateName": "probe-"}
    body["spec"]["sharedCounters"] = [{"name": "b", "counters": {"c": {"value": "2"}}}]
    version = apiserver.resource_version
    answer = await kube.create_object(RESOURCE_SLICE, body, dry_run=True)
    assert answer["metadata"]["name"].startswith("probe-") and "sharedCounters" not in answer["spec"]
    assert apiserver.requests[-1].query == {"dryRun": "All"}
    assert apiserver.objects("resourceslices") == [] and apiserver.resource_version == version


async def test_resource_claims_are_namespaced(kube, apiserver):
    claim = {"metadata": {"name": "one-gpu", "namespace": "team-a"}, "spec": {"devices": {"requests": []}}}
    await kube.create_object(RESOURCE_CLAIM, claim)
    assert apiserver.requests[-1].path == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"
    read = await kube.get_object(RESOURCE_CLAIM, "one-gpu", "team-a")
    assert read is not None and read["spec"] == claim["spec"]
    assert await kube.get_object(RESOURCE_CLAIM, "one-gpu", "team-b") is None
    assert [c["metadata"]["name"] for c in await kube.list_objects(RESOURCE_CLAIM)] == ["one-gpu"]
    assert apiserver.requests[-1].path == "/apis/resource.k8s.io/v1/resourceclaims"
    await kube.delete_object(RESOURCE_CLAIM, "one-gpu", "team-a")
    assert await kube.list_objects(RESOURCE_CLAIM, "team-a") == []


async def test_older_resource_api_versions_reach_the_same_objects(kube, apiserver):
    beta = ObjectKind("resource.k8s.io/v1beta1", "ResourceSlice", "resourceslices", False)
    await kube.create_object(beta, _slice("s", NODE))
    assert apiserver.requests[-1].path == "/apis/resource.k8s.io/v1beta1/resourceslices"
    read = await kube.get_object(RESOURCE_SLICE, "s")
    assert read is not None and read["apiVersion"] == "resource.k8s.io/v1"


async def test_config_maps_through_the_generic_calls(kube):
    await kube.create_object(CONFIG_MAP, {"metadata": {"name": "plain"}, "data": {"a": "1"}})
    listed = await kube.list_objects(CONFIG_MAP, NS)
    assert [(obj["metadata"]["namespace"], obj["data"]) for obj in listed] == [(NS, {"a": "1"})]


# ---- Backoff --------------------------------------------------------------------------------


async def test_retry_rides_out_an_outage(kube, apiserver):
    apiserver.unavailable = True

    async def back_soon():
        await asyncio.sleep(0.3)
        apiserver.unavailable = False

    task = asyncio.create_task(back_soon())
    labels = await Backoff(initial=0.02, cap=0.05).retry(lambda: kube.get_node(NODE))
    await task
    assert labels == {"kubernetes.io/hostname": NODE}
    assert sum(r.path == f"/api/v1/nodes/{NODE}" for r in apiserver.requests) >= 3


async def test_retry_raises_at_once_what_trying_again_cannot_fix(kube):
    first = await kube.create_config_map(NS, "reset", {})
    await kube.replace_config_map(NS, "reset", {"a": "b"}, first.resource_version)
    calls = 0

    async def stale_replace():
        nonlocal calls
        calls += 1
        return await kube.replace_config_map(NS, "reset", {"a": "c"}, first.resource_version)

    with pytest.raises(KubeConflict):
        await Backoff(initial=0.01).retry(stale_replace)
    assert calls == 1


async def test_retry_gives_up_after_the_attempts_and_logs_once(kube, apiserver, caplog):
    apiserver.unavailable = True
    with (
        caplog.at_level(logging.WARNING, logger="ix_device_plugin.runtime.backoff"),
        pytest.raises(KubeError) as caught,
    ):
        await Backoff(initial=0.01, cap=0.01).retry(lambda: kube.get_node(NODE), attempts=4)
    assert caught.value.status == 503
    assert sum(r.path == f"/api/v1/nodes/{NODE}" for r in apiserver.requests) == 4
    assert len([r for r in caplog.records if "503" in r.getMessage()]) == 1
