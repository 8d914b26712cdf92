"""The cluster itself: the components are the pinned releases, the node is Ready and runs a pod on the bridge
network from a locally built image, and pods reach the API server through the `kubernetes` Service (kube-proxy) with
their own tokens. Everything else in the suite stands on this.
"""

from __future__ import annotations

import ipaddress
import json

import pytest
from harness.build import versions
from harness.cluster import MICROK8S_KUBELET_ROOT, POD_CIDR, SERVICE_IP, Cluster
from harness.kube import Kubectl
from harness.pods import busybox_pod, phase_is, wait_pod
from harness.project_image import BuiltImage


def test_the_components_are_the_pinned_releases(cluster: Cluster, admin: Kubectl) -> None:
    pinned = versions()
    server = json.loads(admin("version", "-o", "json"))
    assert server["serverVersion"]["gitVersion"] == pinned["KUBERNETES_VERSION"]
    assert server["clientVersion"]["gitVersion"] == pinned["KUBERNETES_VERSION"]
    node = admin.get("node", cluster.node_name)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == pinned["KUBERNETES_VERSION"]
    assert info["containerRuntimeVersion"] == f"containerd://{pinned['CONTAINERD_VERSION'].removeprefix('v')}"


def test_the_kubelet_root_is_as_long_as_microk8s(cluster: Cluster) -> None:
    """The kubelet's root is at least as long as MicroK8s's, so every scenario's sockets are as long as there."""
    assert len(str(cluster.kubelet_root).encode()) >= len(MICROK8S_KUBELET_ROOT.encode())
    served = cluster.pod_resources_socket  # made by the kubelet in its root
    assert served.is_socket() and served.is_relative_to(cluster.kubelet_root)


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


# In the pod, with the in-cluster configuration every client library uses (KUBERNETES_SERVICE_HOST/PORT, the
# ServiceAccount's token and CA, the certificate verified for the Service's IP): the SelfSubjectReview of its own
# token (who the API server says it is), its own Pod (what its Role grants) and its namespace's Secrets (what nothing
# grants). The project's image, for a Python whose TLS verifies (busybox's wget verifies nothing, and the API
# server's TLS refuses its handshake).
READ_THE_API = """
import json, os, ssl, urllib.error, urllib.request
account = "/var/run/secrets/kubernetes.io/serviceaccount"
api = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
token, namespace = (open(f"{account}/{name}").read() for name in ("token", "namespace"))
tls = ssl.create_default_context(cafile=f"{account}/ca.crt")
def call(path, body=None):
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        with urllib.request.urlopen(urllib.request.Request(api + path, body, headers), context=tls) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as error:
        return {"status": error.code}
review = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
print("SERVICE", api)
print("REVIEW", json.dumps(call("/apis/authentication.k8s.io/v1/selfsubjectreviews", review)))
print("POD", json.dumps(call(f"/api/v1/namespaces/{namespace}/pods/{os.environ['POD_NAME']}")))
print("SECRETS", json.dumps(call(f"/api/v1/namespaces/{namespace}/secrets")))
"""


def said(output: str, marker: str) -> str:
    (line,) = [line for line in output.splitlines() if line.startswith(f"{marker} ")]
    return line.split(" ", 1)[1]


@pytest.mark.parametrize("host_network", [False, True], ids=["pod-network", "host-network"])
def test_a_pod_reads_the_api_with_its_own_token_through_the_kubernetes_service(
    cluster: Cluster, admin: Kubectl, namespace: str, project_image: BuiltImage, host_network: bool
) -> None:
    admin("create", "serviceaccount", "reader", "-n", namespace)
    admin("create", "role", "read-pods", "--verb=get", "--resource=pods", "-n", namespace)
    binding = ["rolebinding", "reader", "--role=read-pods", f"--serviceaccount={namespace}:reader"]
    admin("create", *binding, "-n", namespace)
    own_name = {"fieldRef": {"fieldPath": "metadata.name"}}
    container = {
        "name": "main",
        "image": project_image.name,
        "imagePullPolicy": "Never",
        "command": ["python", "-c", READ_THE_API],
        "env": [{"name": "POD_NAME", "valueFrom": own_name}],
    }
    spec = {"containers": [container], "restartPolicy": "Never", "serviceAccountName": "reader"}
    spec["hostNetwork"] = host_network
    admin.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reader"}, "spec": spec}, "-n", namespace)
    done = wait_pod(admin, namespace, "reader", phase_is("Succeeded", "Failed"), "Succeeded")
    output = admin("logs", "reader", "-n", namespace)
    assert done["status"]["phase"] == "Succeeded", output
    assert said(output, "SERVICE") == f"https://{SERVICE_IP}:443", output
    user = json.loads(said(output, "REVIEW"))["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{namespace}:reader"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["reader"]
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [cluster.node_name]
    assert json.loads(said(output, "POD"))["metadata"]["uid"] == done["metadata"]["uid"]
    assert json.loads(said(output, "SECRETS")) == {"status": 403}, output
