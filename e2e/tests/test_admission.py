"""The chart's admission policies on the real API server, with the agents' own pod-bound tokens: each write the
RBAC grants is allowed on the caller's own node's objects and refused on anything else (another node's ConfigMap,
slice, pod or Event; coredns; a pod's image; another driver's slice; a Volcano refusal Event from another node; any
change of its Node but the device-access label), and a token bound to no node writes nothing.
The refusals are the policies' (the RBAC alone would allow every one of them).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from harness.cluster import Cluster
from harness.dra import pod_bound_kubeconfig
from harness.grants import applied_grants, refused, until_policies_refuse
from harness.kube import Kubectl, KubectlError, Obj, kubeconfig_text
from harness.pods import STAY, busybox_pod
from harness.waits import until

NAMESPACE = "kube-system"
PLUGIN, DRA = "iluvatar-device-plugin", "iluvatar-dra-driver"
ACCESS_LABEL = "iluvatar.com/gpu.device-access"  # core/deviceaccess.py
DRIVER = "gpu.iluvatar.com"
OTHER_NODE = "another-node"
VALUES = {
    "dra": {"enabled": True},
    "features": {"perNodeConfig": True, "gpuReset": True, "volcano": True, "selfHealing": True},
}
REFUSED_REASON = "VolcanoAnnotationRefused"  # deviceplugin/features/volcanotrust.py
NO_NODE = "a token bound to no node (not the agent pod's own token) writes nothing"
SLICE_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1")


def config_map(name: str, namespace: str = NAMESPACE, **data: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}


def resource_slice(
    name: str, node: str, driver: str = DRIVER, api_version: str = SLICE_VERSIONS[0], pool: str | None = None
) -> Obj:
    pool_spec = {"name": pool or node, "generation": 1, "resourceSliceCount": 1}
    spec = {"driver": driver, "nodeName": node, "pool": pool_spec}
    return {"apiVersion": api_version, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def own_slice_name(node: str, version: str) -> str:
    """A name of the node's pool (`<node>-gpu.iluvatar.com-<n>`) for a slice written at version, far above any the
    driver itself uses."""
    return f"{node}-{DRIVER}-9{SLICE_VERSIONS.index(version)}"


def core_event(name: str, kind: str, about: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "name": about, "uid": about},
        "reason": "AdmissionCheck",
        "message": "an Event written by the agent's token",
        "type": "Normal",
        "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "source": {"component": "ix-device-plugin", "host": about},
        "reportingComponent": "ix-device-plugin",
        "reportingInstance": about,
    }


def events_event(name: str, kind: str, about: str) -> Obj:
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "iluvatar.com/ix-device-plugin",
        "reportingInstance": about,
        "action": "Check",
        "reason": "AdmissionCheck",
        "note": "an Event written by the agent's token",
        "type": "Normal",
        "regarding": {"apiVersion": "v1", "kind": kind, "name": about},
    }


@pytest.fixture(scope="module")
def grants(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Obj]]:
    """Both agents' ServiceAccounts, RBAC and admission policies, as the chart renders them, applied."""
    with applied_grants(cluster, tmp_path_factory.mktemp("helm-admission"), VALUES) as objects:
        assert {obj["kind"] for obj in objects} >= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
        yield objects


def pod_token(cluster: Cluster, service_account: str, directory: Path) -> tuple[Kubectl, str]:
    """kubectl with a token of service_account bound to a pod of its own on the node; the pod's name."""
    pod = f"{service_account}-{directory.name}"
    path = pod_bound_kubeconfig(cluster, NAMESPACE, service_account, pod, directory / "kubeconfig")
    return cluster.admin.with_kubeconfig(path), pod


@pytest.fixture(scope="module")
def plugin(cluster: Cluster, grants: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    """The device plugin's ServiceAccount with its pod-bound token, once its policies are in force."""
    account, pod = pod_token(cluster, PLUGIN, tmp_path_factory.mktemp("plugin-token"))
    try:
        probe = config_map("ix-admission-probe")
        until_policies_refuse(account, probe, "the admission policies in force")
        yield account
    finally:
        cluster.admin.delete("pod", pod, NAMESPACE, wait=False)


@pytest.fixture(scope="module")
def dra(cluster: Cluster, plugin: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    """The DRA driver's ServiceAccount with its pod-bound token, once its policies are in force."""
    account, pod = pod_token(cluster, DRA, tmp_path_factory.mktemp("dra-token"))
    try:
        probe = resource_slice("admission-probe", OTHER_NODE)
        until_policies_refuse(account, probe, "the driver's admission policies in force")
        yield account
    finally:
        cluster.admin.delete("pod", pod, NAMESPACE, wait=False)
        for version in SLICE_VERSIONS:
            cluster.admin.delete("resourceslice", own_slice_name(cluster.node_name, version), wait=False)


@pytest.fixture
def cleanup(admin: Kubectl) -> Iterator[list[tuple[str, str, str | None]]]:
    """(kind, name, namespace) to delete as the admin after the test."""
    objects: list[tuple[str, str, str | None]] = []
    yield objects
    for kind, name, namespace in objects:
        admin.delete(kind, name, namespace, wait=False)


# ------------------------------------------------------------------ ConfigMaps


def forget_configmaps(admin: Kubectl, *names: str) -> None:
    """The node's ConfigMaps gone before a scenario creates them: an agent of an earlier scenario on this cluster
    (the chart's, the soak's) writes them and they outlive it."""
    for name in names:
        admin.delete("configmap", name, NAMESPACE)


def test_the_plugin_writes_its_own_nodes_two_configmaps(
    cluster: Cluster, plugin: Kubectl, cleanup: list[tuple[str, str, str | None]]
) -> None:
    reset, info = f"ix-gpu-reset-{cluster.node_name}", f"ix-device-info-cm-{cluster.node_name}"
    cleanup += [("configmap", reset, NAMESPACE), ("configmap", info, NAMESPACE)]
    forget_configmaps(cluster.admin, reset, info)
    plugin.create(config_map(reset, gpuReset="reset: false"))
    stored = plugin.get("configmap", reset, NAMESPACE)
    plugin("replace", "-f", "-", input_text=_json({**stored, "data": {"gpuReset": "reset: true"}}))
    plugin.create(config_map(info, DeviceInfoCfg="{}"))
    patch(plugin, f"/api/v1/namespaces/{NAMESPACE}/configmaps/{info}", {"data": {"DeviceListCfg": "{}"}})
    assert cluster.admin.get("configmap", info, NAMESPACE)["data"] == {"DeviceInfoCfg": "{}", "DeviceListCfg": "{}"}


def test_the_plugin_is_refused_another_nodes_configmap_and_coredns(
    admin: Kubectl, plugin: Kubectl, cleanup: list[tuple[str, str, str | None]]
) -> None:
    message = refused(lambda: plugin.create(config_map(f"ix-gpu-reset-{OTHER_NODE}")), f"{PLUGIN}-configmaps")
    assert f"ConfigMap {NAMESPACE}/ix-gpu-reset-{OTHER_NODE}: the plugin on node" in message
    if admin.get_or_none("configmap", "coredns", NAMESPACE) is None:
        admin.create(config_map("coredns", Corefile=".:53 {}"))
        cleanup.append(("configmap", "coredns", NAMESPACE))
    assert plugin.can_i("patch", "configmaps/coredns", NAMESPACE)  # RBAC alone would let it through
    forged = {"data": {"Corefile": ".:53 { forward . 192.0.2.1 }"}}
    coredns = f"/api/v1/namespaces/{NAMESPACE}/configmaps/coredns"
    refused(lambda: patch(plugin, coredns, forged), f"{PLUGIN}-configmaps")
    assert admin.get("configmap", "coredns", NAMESPACE)["data"]["Corefile"] != ".:53 { forward . 192.0.2.1 }"


def test_the_dra_driver_writes_only_its_own_nodes_reset_handshake(
    cluster: Cluster, dra: Kubectl, cleanup: list[tuple[str, str, str | None]]
) -> None:
    reset = f"ix-gpu-reset-{cluster.node_name}"
    cleanup.append(("configmap", reset, NAMESPACE))
    forget_configmaps(cluster.admin, reset)
    dra.create(config_map(reset, gpuReset="reset: false"))
    refused(lambda: dra.create(config_map(f"ix-device-info-cm-{cluster.node_name}")), f"{DRA}-configmaps")


# ------------------------------------------------------------------ tokens without a node


def test_a_token_without_a_node_writes_nothing(
    cluster: Cluster, admin: Kubectl, plugin: Kubectl, tmp_path: Path, cleanup: list[tuple[str, str, str | None]]
) -> None:
    own = config_map(f"ix-gpu-reset-{cluster.node_name}")
    plain = admin.with_kubeconfig(cluster.service_account_kubeconfig(NAMESPACE, PLUGIN, tmp_path / "plain"))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ix-admission-holder", "namespace": NAMESPACE}}
    admin.create(secret)
    cleanup.append(("secret", "ix-admission-holder", NAMESPACE))
    bound = ["--bound-object-kind=Secret", "--bound-object-name=ix-admission-holder"]
    token = admin("create", "token", PLUGIN, "-n", NAMESPACE, *bound, "--duration=1h").strip()
    secret_bound = plain.with_kubeconfig(_token_kubeconfig(cluster, token, tmp_path / "secret"))
    for account in (plain, secret_bound):
        assert account.can_i("create", "configmaps", NAMESPACE)  # RBAC grants it; the node is what is missing
        assert NO_NODE in refused(lambda a=account: a.create(own, "--dry-run=server"), f"{PLUGIN}-configmaps")
    plain_dra = admin.with_kubeconfig(cluster.service_account_kubeconfig(NAMESPACE, DRA, tmp_path / "plain-dra"))
    slice_ = resource_slice("admission-no-node", cluster.node_name)
    assert NO_NODE in refused(lambda: plain_dra.create(slice_, "--dry-run=server"), f"{DRA}-resourceslices")


# ------------------------------------------------------------------ pods (Volcano mode)


def test_the_plugin_patches_only_volcano_annotations_of_its_own_nodes_pods(
    cluster: Cluster, admin: Kubectl, plugin: Kubectl, cleanup: list[tuple[str, str, str | None]]
) -> None:
    own, other = _pod("admission-own", cluster.node_name), _pod("admission-other", OTHER_NODE)
    for pod in (own, other):
        admin.create(pod)
        cleanup.append(("pod", pod["metadata"]["name"], "default"))

    def annotate(name: str, annotations: dict[str, str]) -> Obj:
        return patch(plugin, f"/api/v1/namespaces/default/pods/{name}", {"metadata": {"annotations": annotations}})

    annotate("admission-own", {"predicate-time": "18446744073709551615"})
    annotate("admission-own", {"iluvatar.com/DevRealAlloc": "0", "iluvatar.com/DevKubelet": "0"})
    annotations = admin.get("pod", "admission-own", "default")["metadata"]["annotations"]
    assert annotations["predicate-time"] == "18446744073709551615" and annotations["iluvatar.com/DevRealAlloc"] == "0"
    policy = f"{PLUGIN}-pods"
    refused(lambda: annotate("admission-own", {"iluvatar.com/DevVolcano": "1"}), policy)
    own_path = "/api/v1/namespaces/default/pods/admission-own"
    refused(lambda: patch(plugin, own_path, {"metadata": {"labels": {"tier": "forged"}}}), policy)
    image = {"spec": {"containers": [{"name": "main", "image": "registry.example/evil:1"}]}}
    assert "changes only the annotations" in refused(lambda: patch(plugin, own_path, image, "strategic-merge"), policy)
    message = refused(lambda: annotate("admission-other", {"predicate-time": "1"}), policy)
    assert "changes only pods bound to its own node" in message
    assert (
        admin.get("pod", "admission-own", "default")["spec"]["containers"][0]["image"]
        == own["spec"]["containers"][0]["image"]
    )


def _pod(name: str, node: str) -> Obj:
    pod = busybox_pod(name, STAY)
    pod["metadata"]["namespace"] = "default"
    pod["spec"].update(nodeName=node, automountServiceAccountToken=False)
    return pod


# ------------------------------------------------------------------ Events


def test_the_agents_write_events_only_about_their_own_node(
    cluster: Cluster, admin: Kubectl, plugin: Kubectl, dra: Kubectl, cleanup: list[tuple[str, str, str | None]]
) -> None:
    """core/v1 Events, as the agents write them; events.k8s.io/v1 ones too, which the chart does not grant: a Role
    granted here shows the policy binds them as well, should an operator grant them."""
    node = cluster.node_name
    admin.create(_events_k8s_io_grant())
    cleanup += [("rolebinding", "ix-admission-events", "default"), ("role", "ix-admission-events", "default")]
    for account in (plugin, dra):
        until(lambda a=account: a.can_i("create", "events.events.k8s.io", "default"), 30, "the Role in force")
    for account, who in ((plugin, PLUGIN), (dra, DRA)):
        name = f"{node}.admission-{who}"
        cleanup.append(("event", name, "default"))
        account.create(core_event(name, "Node", node))
        patch(account, f"/api/v1/namespaces/default/events/{name}", {"count": 2})
        account.create(events_event(f"{name}-new", "Node", node), "--dry-run=server")
        policy = f"{who}-events"
        message = refused(
            lambda a=account: a.create(core_event("other", "Node", OTHER_NODE), "--dry-run=server"), policy
        )
        assert f"writes only Events about Node {node}" in message
        refused(lambda a=account: a.create(core_event("pod", "Pod", node), "--dry-run=server"), policy)
        refused(lambda a=account: a.create(events_event("other", "Node", OTHER_NODE), "--dry-run=server"), policy)
        refused(lambda a=account: a.create(events_event("pod", "Pod", node), "--dry-run=server"), policy)


def test_the_plugin_writes_volcano_refusal_events_only_as_reported_by_its_own_node(
    cluster: Cluster, admin: Kubectl, plugin: Kubectl, dra: Kubectl, cleanup: list[tuple[str, str, str | None]]
) -> None:
    """Volcano mode: a Warning Event VolcanoAnnotationRefused about a pod, in the pod's namespace (any: here
    kube-system, which no Role of the chart names), reported by its own node, as volcanorefusals.py writes it.
    Another node's host, another reason, a Normal type, a pod of another namespace, a change to it and the driver's
    token are refused."""
    node = cluster.node_name
    admin.create(_events_k8s_io_grant())
    cleanup += [("rolebinding", "ix-admission-events", "default"), ("role", "ix-admission-events", "default")]
    until(lambda: plugin.can_i("create", "events.events.k8s.io", "default"), 30, "the Role in force")
    own = refusal(f"{node}.refusal", NAMESPACE, node)
    cleanup.append(("event", own["metadata"]["name"], NAMESPACE))
    plugin.create(own)
    assert admin.get("event", own["metadata"]["name"], NAMESPACE)["reason"] == REFUSED_REASON
    policy = f"{PLUGIN}-events"
    in_default = refusal(f"{node}.refusal-default", "default", node)
    cleanup.append(("event", in_default["metadata"]["name"], "default"))
    plugin.create(in_default)
    message = refused(
        lambda: patch(plugin, f"/api/v1/namespaces/default/events/{in_default['metadata']['name']}", {"count": 2}),
        policy,
    )
    assert f"new Warning Events {REFUSED_REASON} about a pod, reported by node {node}" in message
    forged: list[Obj] = [
        refusal("other-host", NAMESPACE, node, host=OTHER_NODE),
        refusal("other-instance", NAMESPACE, node, instance=OTHER_NODE),
        refusal("no-host", NAMESPACE, node, host=""),
        {**refusal("other-reason", NAMESPACE, node), "reason": "AdmissionCheck"},
        {**refusal("normal", NAMESPACE, node), "type": "Normal"},
        refusal("about-a-node", "default", node, kind="Node"),
    ]
    for event in forged:
        refused(lambda e=event: plugin.create(e, "--dry-run=server"), policy)
    new_api = {**events_event("new-api", "Pod", node), "type": "Warning", "reason": REFUSED_REASON}
    new_api["regarding"]["namespace"] = "default"
    plugin.create(new_api, "--dry-run=server")
    new_api_other = {**new_api, "reportingInstance": OTHER_NODE, "metadata": {"name": "o", "namespace": "default"}}
    refused(lambda: plugin.create(new_api_other, "--dry-run=server"), policy)
    elsewhere = {**new_api, "metadata": {"name": "e", "namespace": "default"}}
    elsewhere["regarding"] = {**new_api["regarding"], "namespace": NAMESPACE}  # events.k8s.io/v1 lets this through
    refused(lambda: plugin.create(elsewhere, "--dry-run=server"), policy)
    refused(lambda: dra.create(refusal("driver", "default", node), "--dry-run=server"), f"{DRA}-events")


def refusal(
    name: str, namespace: str, node: str, host: str | None = None, instance: str | None = None, kind: str = "Pod"
) -> Obj:
    """A core/v1 Warning Event that a pod's Volcano annotations are refused, as volcanorefusals.py writes it."""
    event = core_event(name, kind, "tenant-pod")
    event["metadata"]["namespace"] = namespace
    event["involvedObject"] |= {"namespace": namespace} if kind == "Pod" else {}
    event |= {"type": "Warning", "reason": REFUSED_REASON, "message": "its predicate-time annotation was forged"}
    event["source"] = {"component": "ix-device-plugin", "host": node if host is None else host}
    event["reportingInstance"] = node if instance is None else instance
    return event


def _events_k8s_io_grant() -> list[Obj]:
    meta = {"name": "ix-admission-events", "namespace": "default"}
    rules = [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}]
    subjects = [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE} for name in (PLUGIN, DRA)]
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": meta["name"]}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": role_ref,
            "subjects": subjects,
        },
    ]


# ------------------------------------------------------------------ the device-access label


def test_the_agents_change_only_the_device_access_label_of_their_own_node(
    cluster: Cluster, plugin: Kubectl, dra: Kubectl
) -> None:
    """Dry runs of each patch (the policies run on them, the Node stays as it is): the label set to a value the
    agent writes is allowed; another value, another label, an annotation or the spec (a cordon) is refused."""
    own = f"/api/v1/nodes/{cluster.node_name}?dryRun=All"
    for account, who in ((plugin, PLUGIN), (dra, DRA)):
        policy = f"{who}-node-label"
        for value in ("nri", "runtime", "privileged", "none"):
            labels = patch(account, own, {"metadata": {"labels": {ACCESS_LABEL: value}}})["metadata"]["labels"]
            assert labels[ACCESS_LABEL] == value
        for forged in (
            {"metadata": {"labels": {ACCESS_LABEL: "anything"}}},
            {"metadata": {"labels": {"ix-admission": "forged"}}},
            {"metadata": {"annotations": {"ix-admission": "forged"}}},
            {"spec": {"unschedulable": True}},
        ):
            refused(lambda a=account, f=forged: patch(a, own, f), policy)


# ------------------------------------------------------------------ ResourceSlices


def test_the_driver_writes_its_own_nodes_slices_at_every_served_version(
    cluster: Cluster, admin: Kubectl, dra: Kubectl
) -> None:
    """At v1 and at both beta versions, which the cluster serves (--runtime-config) as a cluster may: the policy
    reads the same fields at each, and the API server checks each write at the version it was made. Refused at each:
    another node's slice, a slice on this node in another node's pool (the scheduler knows a device by driver, pool
    and name: node-b's free GPUs would become unallocatable), a slice under another node's name (taken first, it
    would keep that node's driver from publishing), another driver's slice."""
    served = admin("api-versions").split()
    assert [version for version in SLICE_VERSIONS if version not in served] == []  # every version 1.37 has
    policy = f"{DRA}-resourceslices"
    node = cluster.node_name
    for version in SLICE_VERSIONS:
        name = own_slice_name(node, version)
        dra.create(resource_slice(name, node, api_version=version))
        kind = f"resourceslices.{version.rpartition('/')[2]}.resource.k8s.io"
        # Read until seen: a read just after the create was once answered NotFound (at v1beta1, machine busy).
        stored = until(lambda k=kind, n=name: dra.get_or_none(k, n), 30, f"{name} read back at {version}", [])
        stored["spec"]["pool"]["generation"] = 2
        dra("replace", "-f", "-", input_text=_json(stored))
        dra("delete", "resourceslice", name)
        message = refused(
            lambda v=version: dra.create(
                resource_slice("admission-other", OTHER_NODE, api_version=v), "--dry-run=server"
            ),
            policy,
        )
        assert f"writes only the slices of {DRIVER} on node {cluster.node_name}" in message
        other_pool = resource_slice(f"{node}-{DRIVER}-1", node, api_version=version, pool=OTHER_NODE)
        message = refused(lambda s=other_pool: dra.create(s, "--dry-run=server"), policy)
        assert f"the driver on node {node} publishes only its own pool, {node}" in message
        other_driver = resource_slice(f"{node}-{DRIVER}-2", node, "other.example.com", version)
        refused(lambda s=other_driver: dra.create(s, "--dry-run=server"), policy)
        # Names are checked on real writes only: a dry run stores nothing (the driver's probe of what the server keeps
        # uses a name the server makes up).
        dra.create(resource_slice(f"{node}-{DRIVER}-check-x7k2q", node, api_version=version), "--dry-run=server")
        for wrong in (f"{OTHER_NODE}-{DRIVER}", f"{OTHER_NODE}-{DRIVER}-3", f"{node}-{DRIVER}-1x", "admission-own"):
            try:
                slice_ = resource_slice(wrong, node, api_version=version)
                message = refused(lambda s=slice_: dra.create(s), policy)
            finally:
                admin.delete("resourceslice", wrong, wait=False)
            assert f"names its slices {node}-{DRIVER} or {node}-{DRIVER}-<n>" in message
    admin.create(resource_slice("admission-theirs", cluster.node_name, "other.example.com"))
    try:
        assert dra.can_i("delete", "resourceslices/admission-theirs")
        refused(lambda: dra("delete", "resourceslice", "admission-theirs"), policy)
    finally:
        admin.delete("resourceslice", "admission-theirs", wait=False)


# ------------------------------------------------------------------ helpers


def patch(account: Kubectl, path: str, body: Obj, kind: str = "merge") -> Obj:
    """One PATCH request to the API server with account's token, as the agent makes it (kubectl patch would read
    the object first, which the agent neither does nor is granted); KubectlError with the server's answer."""
    config = yaml.safe_load(account.kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    request = urllib.request.Request(
        cluster["server"] + path,
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={"Authorization": f"Bearer {user['token']}", "Content-Type": f"application/{kind}-patch+json"},
    )
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise KubectlError(["PATCH", path], error.code, error.read().decode(errors="replace")) from None


def _json(obj: Obj) -> str:
    return json.dumps(obj)


def _token_kubeconfig(cluster: Cluster, token: str, path: Path) -> Path:
    assert cluster.pki is not None
    path.write_text(kubeconfig_text(cluster.server, cluster.pki.ca.cert, f"{NAMESPACE}-{PLUGIN}", token=token))
    return path


# ------------------------------------------------------------------ ResourceClaims' device status


def test_the_driver_writes_only_its_own_entries_of_a_claims_device_status(
    cluster: Cluster, admin: Kubectl, dra: Kubectl, cleanup: list[tuple[str, str, str | None]]
) -> None:
    """A claim allocated on the node a device of this node's pool and one of another pool (as the scheduler would
    write it, here by the admin): the driver writes its own entry; another pool's is refused by the policy, and the
    claim's consumers by the API server itself (they need resourceclaims/binding)."""
    node = cluster.node_name
    requests = [{"name": name, "exactly": {"deviceClassName": DRIVER}} for name in ("own", "theirs")]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "admission-claim", "namespace": "default"},
        "spec": {"devices": {"requests": requests}},
    }
    admin.create(claim)
    cleanup.append(("resourceclaim", "admission-claim", "default"))
    results = [
        {"request": "own", "driver": DRIVER, "pool": node, "device": "gpu-0"},
        {"request": "theirs", "driver": DRIVER, "pool": OTHER_NODE, "device": "gpu-0"},
    ]
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    allocation = {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [term]}}
    admin(
        *("patch", "resourceclaim", "admission-claim", "-n", "default", "--subresource=status", "--type=merge"),
        *("-p", json.dumps({"status": {"allocation": allocation}})),
    )
    status = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/admission-claim/status"
    own = {"driver": DRIVER, "pool": node, "device": "gpu-0", "data": {"uuid": "admission"}}
    patch(dra, status, {"status": {"devices": [own]}})
    stored = admin.get("resourceclaim", "admission-claim", "default")["status"]["devices"]
    assert [(entry["pool"], entry["device"]) for entry in stored] == [(node, "gpu-0")]
    policy = f"{DRA}-claim-status"
    theirs = {"driver": DRIVER, "pool": OTHER_NODE, "device": "gpu-0"}
    message = refused(lambda: patch(dra, status, {"status": {"devices": [own, theirs]}}), policy)
    assert f"changes only the device status of {DRIVER} in pool {node}" in message
    consumer = {"resource": "pods", "name": "someone", "uid": "00000000-0000-0000-0000-000000000001"}
    with pytest.raises(KubectlError) as raised:  # the API server's own check (1.37) comes before the policy's
        patch(dra, status, {"status": {"reservedFor": [consumer]}})
    assert 'requires resource=\\"resourceclaims/binding\\"' in raised.value.stderr, raised.value.stderr
