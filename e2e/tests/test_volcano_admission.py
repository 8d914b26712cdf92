"""Volcano mode's admission policy iluvatar-device-plugin-volcano-keys on the real API server. A tenant (a
ServiceAccount bound to the `edit` role in its namespace) cannot give its pod Volcano's annotations, whatever field
manager it names: not by a patch with ?fieldManager=vc-scheduler, not on create, not by rewriting managedFields; its
pods without them are created, changed and deleted as before. Volcano's scheduler's account (volcano-scheduler in
volcano-system, as Volcano's installer makes it) sets them, and the plugin, with its own pod-bound token, still writes
its keys on its own node's pod. Each refusal is the policy's: the `edit` role alone allows the write.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from harness.cluster import Cluster
from harness.dra import pod_bound_kubeconfig
from harness.grants import applied_grants, until_policies_refuse
from harness.grants import refused as refused_by
from harness.kube import Kubectl, Obj, api_request
from harness.pods import STAY, busybox_pod
from harness.volcano import DEV_VOLCANO, FIELD_MANAGER, PREDICATE_TIME, annotate, volcano_scheduler
from harness.volcano import USER as SCHEDULER_USER
from harness.waits import until

NAMESPACE = "kube-system"
PLUGIN = "iluvatar-device-plugin"
POLICY = f"{PLUGIN}-volcano-keys"
PODS_POLICY = f"{PLUGIN}-pods"
VALUES = {"features": {"volcano": True}}
TENANTS = "ix-volcano-tenant"  # the tenant's namespace
TENANT = "tenant"  # its ServiceAccount, bound to the edit role there
DEV_REAL_ALLOC, DEV_KUBELET = "iluvatar.com/DevRealAlloc", "iluvatar.com/DevKubelet"  # deviceplugin/features/volcano.py
TAKEN = str(2**64 - 1)  # the predicate-time the plugin writes on a pod it served


def refused(call: Callable[[], Any], policy: str = POLICY) -> str:
    """The API server's refusal of call, which must be policy's (this file's by default); the message."""
    return refused_by(call, policy)


def tenant_pod(name: str, node: str, annotations: dict[str, str] | None = None) -> Obj:
    """A pod of the tenant's, bound to node by its spec (no scheduler involved), with no token."""
    pod = busybox_pod(name, STAY, annotations=annotations)
    pod["metadata"]["namespace"] = TENANTS
    pod["spec"].update(nodeName=node, automountServiceAccountToken=False)
    return pod


def annotations_of(admin: Kubectl, name: str) -> dict[str, str]:
    return admin.get("pod", name, TENANTS)["metadata"].get("annotations") or {}


def managers_of(admin: Kubectl, name: str) -> set[str]:
    return {entry["manager"] for entry in managed_fields(admin, name)}


def managed_fields(admin: Kubectl, name: str) -> list[Obj]:
    """The pod's metadata.managedFields (kubectl shows them only when asked)."""
    return admin.get("pod", name, TENANTS, "--show-managed-fields")["metadata"].get("managedFields") or []


def merge_patch(account: Kubectl, name: str, body: Obj, query: str = "") -> Obj:
    """One merge patch of a tenant's pod, as a client writes it (query: e.g. ?fieldManager=vc-scheduler)."""
    path = f"/api/v1/namespaces/{TENANTS}/pods/{name}{query}"
    return api_request(account, "PATCH", path, body, "application/merge-patch+json")


@pytest.fixture(scope="module")
def policies(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Obj]]:
    """The chart's ServiceAccount, RBAC and admission policies in Volcano mode, as it renders them, applied."""
    with applied_grants(cluster, tmp_path_factory.mktemp("helm-volcano-admission"), VALUES) as objects:
        assert POLICY in {obj["metadata"]["name"] for obj in objects if obj["kind"] == "ValidatingAdmissionPolicy"}
        yield objects


@pytest.fixture(scope="module")
def tenant(cluster: Cluster, policies: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    """kubectl as the tenant: a ServiceAccount of its own namespace bound to the edit role there, once the policy
    is in force (a dry-run create of a pod with the key refused by it)."""
    admin = cluster.admin
    admin("create", "namespace", TENANTS)
    try:
        admin("create", "serviceaccount", TENANT, "-n", TENANTS)
        admin("create", "rolebinding", "tenant-edit", "--clusterrole=edit", f"--serviceaccount={TENANTS}:{TENANT}",
              "-n", TENANTS)  # fmt: skip
        # The namespace's default ServiceAccount, which the tenant's pods run as, made by the controller-manager.
        until(lambda: admin.get_or_none("serviceaccount", "default", TENANTS), 30, "the default ServiceAccount")
        directory = tmp_path_factory.mktemp("tenant-token")
        account = admin.with_kubeconfig(cluster.service_account_kubeconfig(TENANTS, TENANT, directory / "kubeconfig"))
        until(lambda: account.can_i("patch", "pods", TENANTS), 30, "the edit role in force")
        probe = tenant_pod("ix-volcano-probe", cluster.node_name, {DEV_VOLCANO: "probe"})
        until_policies_refuse(account, probe, "the volcano-keys policy in force")
        yield account
    finally:
        admin("delete", "namespace", TENANTS, "--wait=true", "--timeout=90s", timeout=120)


@pytest.fixture(scope="module")
def scheduler(cluster: Cluster, policies: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    """kubectl as Volcano's scheduler: the ServiceAccount volcano-scheduler in volcano-system."""
    with volcano_scheduler(cluster, tmp_path_factory.mktemp("volcano-token") / "kubeconfig") as account:
        yield account


@pytest.fixture(scope="module")
def plugin(cluster: Cluster, policies: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    """The device plugin's ServiceAccount with a token bound to a pod of its own on the node, as the DaemonSet's."""
    directory = tmp_path_factory.mktemp("plugin-token")
    pod = f"{PLUGIN}-{directory.name}"
    path = pod_bound_kubeconfig(cluster, NAMESPACE, PLUGIN, pod, directory / "kubeconfig")
    try:
        yield cluster.admin.with_kubeconfig(path)
    finally:
        cluster.admin.delete("pod", pod, NAMESPACE, wait=False)


@pytest.fixture
def cleanup(admin: Kubectl) -> Iterator[list[str]]:
    """The tenant's pods to delete as the admin after the test."""
    names: list[str] = []
    yield names
    for name in names:
        admin.delete("pod", name, TENANTS, wait=False)


# ------------------------------------------------------------------ the tenant


def test_a_tenants_patch_naming_volcanos_field_manager_is_refused(
    cluster: Cluster, admin: Kubectl, tenant: Kubectl, cleanup: list[str]
) -> None:
    tenant.create(tenant_pod("forger", cluster.node_name))
    cleanup.append("forger")
    assert tenant.can_i("patch", "pods", TENANTS)  # the edit role allows it: the refusal is the policy's
    query = f"?fieldManager={FIELD_MANAGER}"
    for key, value in ((DEV_VOLCANO, "GPU-forged"), (PREDICATE_TIME, "0")):
        body = {"metadata": {"annotations": {key: value}}}
        message = refused(lambda b=body: merge_patch(tenant, "forger", b, query))
        assert (
            f"system:serviceaccount:{TENANTS}:{TENANT} may not set, change or remove the annotations {key}" in message
        )
    message = refused(
        lambda: annotate(tenant, TENANTS, "forger", {DEV_VOLCANO: "GPU-forged", PREDICATE_TIME: "0"}, FIELD_MANAGER)
    )
    assert SCHEDULER_USER in message  # the message names who may write them
    assert annotations_of(admin, "forger") == {} and FIELD_MANAGER not in managers_of(admin, "forger")


def test_a_tenants_pod_created_with_the_keys_is_refused(cluster: Cluster, tenant: Kubectl) -> None:
    """Dry runs (admission runs on them, nothing is stored): with the field manager named or not, either key."""
    forged = {DEV_VOLCANO: "GPU-forged", PREDICATE_TIME: "0"}
    refused(lambda: tenant.create(tenant_pod("made-forged", cluster.node_name, forged), "--dry-run=server",
                                  f"--field-manager={FIELD_MANAGER}"))  # fmt: skip
    for key, value in (*forged.items(), (DEV_REAL_ALLOC, "GPU-forged"), (DEV_KUBELET, "GPU-forged")):
        pod = tenant_pod("made-forged", cluster.node_name, {key: value, "team": "ml"})
        assert key in refused(lambda p=pod: tenant.create(p, "--dry-run=server"))
    tenant.create(tenant_pod("made-plain", cluster.node_name, {"team": "ml"}), "--dry-run=server")


def test_a_managed_fields_rewrite_naming_volcanos_scheduler_is_refused(
    cluster: Cluster, admin: Kubectl, tenant: Kubectl, cleanup: list[str]
) -> None:
    """The tenant writes managedFields saying vc-scheduler wrote the key, with the key, as kubectl patch sends it."""
    tenant.create(tenant_pod("rewriter", cluster.node_name))
    cleanup.append("rewriter")
    claimed = {
        "manager": FIELD_MANAGER,
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{DEV_VOLCANO}": {}, f"f:{PREDICATE_TIME}": {}}}},
    }
    owned = managed_fields(admin, "rewriter")
    body = {
        "metadata": {
            "annotations": {DEV_VOLCANO: "GPU-forged", PREDICATE_TIME: "0"},
            "managedFields": [*owned, claimed],
        }
    }
    patch = ("patch", "pod", "rewriter", "-n", TENANTS, "--type=merge", "-p", json.dumps(body))
    refused(lambda: tenant(*patch))
    assert annotations_of(admin, "rewriter") == {} and FIELD_MANAGER not in managers_of(admin, "rewriter")


def test_a_tenants_pods_without_the_keys_are_created_changed_and_deleted_as_before(
    cluster: Cluster, admin: Kubectl, tenant: Kubectl, cleanup: list[str]
) -> None:
    tenant.create(tenant_pod("plain", cluster.node_name, {"team": "ml"}))
    cleanup.append("plain")
    tenant("annotate", "pod", "plain", "owner=alice", "-n", TENANTS)
    tenant("label", "pod", "plain", "tier=batch", "-n", TENANTS)
    merge_patch(tenant, "plain", {"metadata": {"annotations": {"team": "vision"}}}, f"?fieldManager={FIELD_MANAGER}")
    tenant("annotate", "pod", "plain", "owner-", "-n", TENANTS)
    pod = admin.get("pod", "plain", TENANTS)
    assert pod["metadata"]["annotations"] == {"team": "vision"} and pod["metadata"]["labels"]["tier"] == "batch"
    tenant("delete", "pod", "plain", "-n", TENANTS, "--wait=false")


# ------------------------------------------------------------------ Volcano's scheduler and the plugin


def test_volcanos_scheduler_sets_its_annotations_and_the_tenant_cannot_change_them(
    cluster: Cluster, admin: Kubectl, tenant: Kubectl, scheduler: Kubectl, cleanup: list[str]
) -> None:
    tenant.create(tenant_pod("placed", cluster.node_name, {"team": "ml"}))
    cleanup.append("placed")
    choice = {DEV_VOLCANO: "GPU-chosen", PREDICATE_TIME: "1"}
    annotate(scheduler, TENANTS, "placed", choice)
    assert annotations_of(admin, "placed") == {"team": "ml", **choice}
    assert FIELD_MANAGER in managers_of(admin, "placed")  # what the plugin believes
    # The tenant still changes the rest of its pod; the keys stay as the scheduler wrote them.
    tenant("annotate", "pod", "placed", "team=vision", "--overwrite", "-n", TENANTS)
    assert annotations_of(admin, "placed") == {"team": "vision", **choice}
    refused(lambda: tenant("annotate", "pod", "placed", f"{PREDICATE_TIME}=0", "--overwrite", "-n", TENANTS))
    refused(lambda: tenant("annotate", "pod", "placed", f"{DEV_VOLCANO}-", "-n", TENANTS))  # nor remove one
    assert annotations_of(admin, "placed") == {"team": "vision", **choice}
    tenant("delete", "pod", "placed", "-n", TENANTS, "--wait=false")  # deleting is not checked


def test_the_plugin_still_writes_its_keys_on_its_own_nodes_pod(
    cluster: Cluster, admin: Kubectl, tenant: Kubectl, scheduler: Kubectl, plugin: Kubectl, cleanup: list[str]
) -> None:
    """The plugin's writes pass this policy and stay bound by its pods policy (its own node's pods, three keys)."""
    tenant.create(tenant_pod("served", cluster.node_name))
    cleanup.append("served")
    annotate(scheduler, TENANTS, "served", {DEV_VOLCANO: "GPU-chosen", PREDICATE_TIME: "1"})
    written = {PREDICATE_TIME: TAKEN, DEV_REAL_ALLOC: "GPU-chosen", DEV_KUBELET: "GPU-chosen"}
    merge_patch(plugin, "served", {"metadata": {"annotations": written}})
    assert annotations_of(admin, "served") == {DEV_VOLCANO: "GPU-chosen", **written}
    message = refused(
        lambda: merge_patch(plugin, "served", {"metadata": {"annotations": {DEV_VOLCANO: "x"}}}), PODS_POLICY
    )
    assert "changes only the annotations" in message  # its exemption here widens nothing
    refused(lambda: tenant("annotate", "pod", "served", f"{DEV_REAL_ALLOC}=GPU-other", "--overwrite", "-n", TENANTS))
    assert annotations_of(admin, "served") == {DEV_VOLCANO: "GPU-chosen", **written}
