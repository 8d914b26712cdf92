"""The cluster itself: the components are the pinned releases, the node is Ready and runs a pod on the bridge
network from a locally built image, and pods reach the API server through the `kubernetes` Service (kube-proxy) with
their own tokens. Everything else in the suite stands on this.
"""

from __future__ import annotations

import ipaddress
import json

import pytest
from harness.build import versions
from harness.cluster import POD_CIDR, SERVICE_IP, Cluster
from harness.kube import Kubectl
from harness.pods import busybox_pod, phase_is, wait_pod


def test_the_components_are_the_pinned_releases(cluster: Cluster, admin: Kubectl) -> None:
    pinned = versions()
    server = json.loads(admin("version", "-o", "json"))
    assert server["serverVersion"]["gitVersion"] == pinned["KUBERNETES_VERSION"]
    assert server["clientVersion"]["gitVersion"] == pinned["KUBERNETES_VERSION"]
    node = admin.get("node", cluster.node_name)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == pinned["KUBERNETES_VERSION"]
    assert info["containerRuntimeVersion"] == f"containerd://{pinned['CONTAINERD_VERSION'].removeprefix('v')}"


def test_a_pod_runs_on_the_pod_network(cluster: Cluster, admin: Kubectl, namespace: str) -> None:
    admin.create(busybox_pod("hello", "echo hello from $(hostname); ip -4 addr show eth0"), "-n", namespace)
    pod = wait_pod(admin, namespace, "hello", phase_is("Succeeded"), "Succeeded")
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(POD_CIDR)
    assert "hello from hello" in admin("logs", "hello", "-n", namespace)


def test_rbac_is_enforced(cluster: Cluster, admin: Kubectl, namespace: str) -> None:
    """A ServiceAccount without bindings may not even list pods in its own namespace."""
    admin("create", "serviceaccount", "nobody", "-n", namespace)
    kubeconfig = cluster.service_account_kubeconfig(namespace, "nobody", cluster.workdir / "nobody.kubeconfig")
    nobody = admin.with_kubeconfig(kubeconfig)
    assert not nobody.can_i("list", "pods", namespace)
    assert admin.can_i("list", "pods", namespace)


# In the pod: the SelfSubjectReview of its own token (who the API server says it is), its own Pod (what its Role
# grants) and the Secrets of its namespace (what nothing grants), each through the `kubernetes` Service as the
# pod's environment names it. busybox's wget does not verify certificates: the harness checks at the cluster's start
# that the API server's certificate names the Service's IP (Cluster.service_readyz).
READ_THE_API = """
account=/var/run/secrets/kubernetes.io/serviceaccount
api=https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
call() { wget -q -O - --no-check-certificate --header "Authorization: Bearer $(cat $account/token)" "$@" 2>&1; }
echo "SERVICE $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
echo "REVIEW $(call --header 'Content-Type: application/json' \
    --post-data '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}' \
    $api/apis/authentication.k8s.io/v1/selfsubjectreviews | tr -d '\n')"
echo "POD $(call $api/api/v1/namespaces/$(cat $account/namespace)/pods/$POD_NAME | tr -d '\n')"
echo "SECRETS $(call $api/api/v1/namespaces/$(cat $account/namespace)/secrets | tr -d '\n')"
echo END
"""


def said(output: str, marker: str) -> str:
    (line,) = [line for line in output.splitlines() if line.startswith(f"{marker} ")]
    return line.split(" ", 1)[1]


@pytest.mark.parametrize("host_network", [False, True], ids=["pod-network", "host-network"])
def test_a_pod_reads_the_api_with_its_own_token_through_the_kubernetes_service(
    cluster: Cluster, admin: Kubectl, namespace: str, host_network: bool
) -> None:
    admin("create", "serviceaccount", "reader", "-n", namespace)
    admin("create", "role", "read-pods", "--verb=get", "--resource=pods", "-n", namespace)
    admin(
        "create", "rolebinding", "reader", "--role=read-pods", f"--serviceaccount={namespace}:reader", f"-n={namespace}"
    )
    pod = busybox_pod("reader", READ_THE_API)
    pod["spec"].update(serviceAccountName="reader", hostNetwork=host_network)
    own_name = {"fieldRef": {"fieldPath": "metadata.name"}}
    pod["spec"]["containers"][0]["env"] = [{"name": "POD_NAME", "valueFrom": own_name}]
    admin.create(pod, "-n", namespace)
    done = wait_pod(admin, namespace, "reader", phase_is("Succeeded", "Failed"), "Succeeded")
    output = admin("logs", "reader", "-n", namespace)
    assert done["status"]["phase"] == "Succeeded" and "END" in output, output
    assert said(output, "SERVICE") == f"{SERVICE_IP}:443", output
    user = json.loads(said(output, "REVIEW"))["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{namespace}:reader"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["reader"]
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [cluster.node_name]
    assert json.loads(said(output, "POD"))["metadata"]["uid"] == done["metadata"]["uid"]
    assert "403 Forbidden" in said(output, "SECRETS"), output
