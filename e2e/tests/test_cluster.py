"""The cluster itself: the components are the pinned releases, the node is Ready and runs a pod on the bridge
network from a locally built image. Everything else in the suite stands on this.
"""

from __future__ import annotations

import ipaddress
import json

from harness.build import versions
from harness.cluster import MICROK8S_KUBELET_ROOT, POD_CIDR, Cluster
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
