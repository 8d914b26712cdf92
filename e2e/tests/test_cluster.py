"""The cluster itself: the components are the pinned releases, the node is Ready and runs a pod on the bridge
network from a locally built image. Everything else in the suite stands on this.
"""

from __future__ import annotations

import ipaddress
import json

from harness.build import versions
from harness.cluster import POD_CIDR, Cluster
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
