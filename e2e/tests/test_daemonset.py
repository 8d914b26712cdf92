"""The deployment as operators run it: the project's image built offline (`make base-image`, `make image`),
loaded into the node's containerd, installed with `helm install` and run by the real kubelet as the chart's
DaemonSet (hostPath mounts, probes, the ConfigMap mounted and edited live), registering from inside its pod.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml
from harness.cluster import Cluster
from harness.helm import CHART, Helm, node_values
from harness.kube import Kubectl
from harness.pods import SHOW_DEVICES, STAY, busybox_pod, node_resource, run_and_read, shown_devices
from harness.project_image import BuiltImage
from harness.release import PLUGIN, agent_pod, agents_gone, running_pod, uninstall
from harness.waits import until

RESOURCE = "iluvatar.com/gpu"
NAMESPACE = "kube-system"
RELEASE = "ix-device-plugin"
GPU_LABEL = "iluvatar.com/gpu.present"


@pytest.fixture(scope="module")
def release(cluster: Cluster, project_image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    """`helm install` of the chart on the node (labelled as a GPU node), with the node's test folders."""
    workdir = tmp_path_factory.mktemp("release")
    helm = Helm(cluster.binaries["helm"], workdir, cluster.kubeconfig("admin"))
    # the chart's own image reference and pull policy (ix-device-plugin:<version>, IfNotPresent); the node-health
    # record in the node's plugins folder, not the host's
    values = node_values(cluster, workdir, cluster.plugins_dir)
    agents_gone(cluster)
    cluster.admin("label", "node", cluster.node_name, f"{GPU_LABEL}=true", "--overwrite")
    helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(helm.values_file(values)))
    try:
        yield helm
    finally:
        uninstall(cluster, helm, RELEASE)
        cluster.admin("label", "node", cluster.node_name, f"{GPU_LABEL}-")


def test_the_daemonset_pod_starts_passes_its_probes_and_registers(
    cluster: Cluster, admin: Kubectl, release: Helm
) -> None:
    what = "the plugin pod Ready (startup and readiness probes: /healthz, /readyz)"
    pod = running_pod(cluster, PLUGIN, 240, what)
    assert pod["spec"]["nodeName"] == cluster.node_name
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    until(
        lambda: node_resource(admin, cluster.node_name, RESOURCE) == (2, 2),
        60,
        f"{RESOURCE}: 2 from the plugin in the pod",
        [cluster.processes["kubelet"].log],
    )
    logs = admin("logs", pod["metadata"]["name"], "-n", NAMESPACE)
    assert "starting (backend simulated)" in logs
    assert "registered" in logs


def test_a_pod_gets_a_gpu_from_the_plugin_in_the_daemonset(
    cluster: Cluster, admin: Kubectl, namespace: str, release: Helm
) -> None:
    running_pod(cluster, PLUGIN)
    _, output = run_and_read(admin, namespace, busybox_pod("from-daemonset", SHOW_DEVICES + STAY, gpus=1))
    nodes, env = shown_devices(output)
    assert len(env["IX_VISIBLE_DEVICES"].split(",")) == 2  # the simulated default: BI-V150, two chips a board
    minors = sorted(int(path.removeprefix("/dev/iluvatar")) for path in nodes if path != "/dev/itrctl")
    assert minors in ([0, 1], [2, 3])  # one whole board, from the host's /dev that the pod mounts
    assert "/dev/itrctl" in nodes


def test_editing_the_configmap_reaches_the_running_plugin(cluster: Cluster, admin: Kubectl, release: Helm) -> None:
    running_pod(cluster, PLUGIN)
    before = agent_pod(admin, PLUGIN)
    assert before is not None
    config = {"flags": {"splitboard": False}, "sharing": {"timeSlicing": {"replicas": 4}}}
    patch = {"data": {"ix-config": yaml.safe_dump(config)}}
    admin("patch", "configmap", "ix-config", "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))
    until(
        lambda: node_resource(admin, cluster.node_name, RESOURCE) == (8, 8),
        180,
        f"{RESOURCE}: 8 after the ConfigMap edit (4 replicas of 2 boards)",
        [cluster.processes["kubelet"].log],
        interval=2,
    )
    after = agent_pod(admin, PLUGIN)
    assert after is not None and after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
