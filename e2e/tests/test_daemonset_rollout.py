"""`helm upgrade` of the device plugin's DaemonSet on the real node, as operators roll out a change: a pod annotation,
then the image (the same build under another tag). The DaemonSet rolls with the chart's surge (maxSurge 1,
maxUnavailable 0): the new pod starts beside the old one and, with the chart's default `zeroDowntimeUpgrade: auto`,
reads the kubelet's version from the Node (its own token, through the `kubernetes` Service), registers at once on its
own socket (POD_UID), and the controller deletes the old pod once the new one is Ready.

Through each rollout the Node's iluvatar.com/gpu (sampled and watched) and the kubelet's allocatable devices
(pod-resources) are recorded every 0.1 s and never drop; a pod created while both plugin pods run gets its GPU and
sees exactly that chip; a pod from before keeps running. A chip taken out of service before the rollouts (an XID 64:
it needs an operator) is out after each: the new pod learns it from the node-health record alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from harness.build import versions
from harness.cluster import Cluster
from harness.helm import CHART, Helm, node_values
from harness.host import http_get
from harness.kube import Kubectl, Obj
from harness.nodewatch import KUBELET, ResourceRecorder
from harness.plugin import (
    bi_v150_chips,
    devices_yaml,
    expected_nodes,
    metric_value,
    node_events,
    node_health,
    write_atomically,
)
from harness.pods import SHOW_DEVICES, STAY, busybox_pod, node_resource, run_and_read, shown_devices
from harness.project_image import BuiltImage
from harness.release import agents_gone, uninstall
from harness.waits import until

RESOURCE = "iluvatar.com/gpu"
NAMESPACE = "kube-system"
RELEASE = "ix-device-plugin"
GPU_LABEL = "iluvatar.com/gpu.present"
SELECTOR = "app.kubernetes.io/name=iluvatar-device-plugin"
HEALTH_PORT = 8080
CHIPS = bi_v150_chips()
OUT = CHIPS[3]  # out of service before the rollouts
# The new pod is Ready no sooner than this after its start, so that the overlap (it registers within seconds) is
# long enough to place a pod in it on a busy machine; the controller deletes the old pod only once it is Ready.
READY_DELAY = 15
ROLLOUT = 180  # seconds a rollout may take
# What the new pod says once `auto` (the chart's default) has read the Node's kubeletVersion and chosen the surge path.
SURGE_FROM_THE_NODE = f"registering beside it (kubelet {versions()['KUBERNETES_VERSION']} keeps several endpoints"


@dataclass(frozen=True)
class Release:
    helm: Helm
    image: BuiltImage
    devices: Path  # the simulated devices file, in the CoreX folder the pods mount
    plugins_dir: Path  # the kubelet plugins directory of the node-health record and the node's role


@pytest.fixture(scope="module")
def release(cluster: Cluster, project_image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """`helm install` on the node over 4 split chips (a device each), with a simulated devices file the tests edit."""
    workdir = tmp_path_factory.mktemp("rollout")
    helm = Helm(cluster.binaries["helm"], workdir, cluster.kubeconfig("admin"))
    corex = workdir / "corex"
    corex.mkdir()
    devices = corex / "devices.yaml"
    devices.write_text(devices_yaml(CHIPS))
    plugins_dir = workdir / "kubelet-plugins"
    values = {
        **node_values(cluster, workdir, plugins_dir, simulated_devices=str(devices)),
        "readinessProbe": {"initialDelaySeconds": READY_DELAY, "periodSeconds": 2},
    }
    agents_gone(cluster)
    cluster.admin("label", "node", cluster.node_name, f"{GPU_LABEL}=true", "--overwrite")
    helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(helm.values_file(values)))
    try:
        yield Release(helm, project_image, devices, plugins_dir)
    finally:
        uninstall(cluster, helm, RELEASE)
        cluster.admin("label", "node", cluster.node_name, f"{GPU_LABEL}-")


@pytest.fixture(scope="module")
def out_of_service(cluster: Cluster, release: Release) -> str:
    """OUT's XID 64 seen by the plugin pod: the chip is out (allocatable 3 of 4) and in the node-health record; then
    the devices file reports nothing any more, so that only the record keeps it out. Its phase in the record."""
    pod = until(lambda: one_ready_pod(cluster.admin), 240, "the plugin pod Ready", kubelet_log(cluster))
    wait_offered(cluster, 4, 4)
    write_atomically(release.devices, devices_yaml([replace(OUT, xids=(64,)) if c == OUT else c for c in CHIPS]))
    wait_offered(cluster, 4, 3)
    until(lambda: recorded(release), 30, "the XID in the node-health record", [])
    write_atomically(release.devices, devices_yaml(CHIPS))
    assert acting(pod) == 1.0
    return str(recorded(release)["phase"])


def kubelet_log(cluster: Cluster) -> list[Path]:
    return [cluster.processes["kubelet"].log]


def wait_offered(cluster: Cluster, capacity: int, allocatable: int) -> None:
    until(
        lambda: node_resource(cluster.admin, cluster.node_name, RESOURCE) == (capacity, allocatable),
        60,
        f"node {RESOURCE} {allocatable} of {capacity}",
        kubelet_log(cluster),
    )


def recorded(release: Release) -> dict[str, object] | None:
    """OUT's entry in the node-health record when it has the XID 64, else None."""
    chip = node_health(release.plugins_dir).get("chips", {}).get(OUT.uuid, {})
    return chip if 64 in chip.get("xids", []) else None


def plugin_pods(admin: Kubectl) -> list[Obj]:
    return admin.items("pods", NAMESPACE, "-l", SELECTOR)


def ready(pod: Obj) -> bool:
    conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return conditions.get("Ready") == "True" and "deletionTimestamp" not in pod["metadata"]


def one_ready_pod(admin: Kubectl) -> Obj | None:
    pods = plugin_pods(admin)
    return pods[0] if len(pods) == 1 and ready(pods[0]) else None


def pod_says(pod: Obj, path: str) -> str:
    """What the plugin in pod answers on path (/readyz, /metrics), on the pod network."""
    return http_get(f"http://{pod['status']['podIP']}:{HEALTH_PORT}{path}").decode()


def pod_metric(pod: Obj, name: str, **labels: str) -> float | None:
    return metric_value(pod_says(pod, "/metrics"), name, **labels)


def acting(pod: Obj) -> float | None:
    return pod_metric(pod, "ix_device_plugin_acting_for_node")


def gpu_pod(admin: Kubectl, namespace: str, name: str) -> str:
    """A pod asking for one GPU (a chip), Running: the chip it sees, exactly its device node and variables."""
    _, output = run_and_read(admin, namespace, busybox_pod(name, SHOW_DEVICES + STAY, gpus=1))
    nodes, env = shown_devices(output)
    (chip,) = [chip for chip in CHIPS if chip.uuid == env["IX_VISIBLE_DEVICES"]]
    assert nodes == expected_nodes([chip]), nodes
    assert chip != OUT
    return chip.uuid


def upgrade(cluster: Cluster, release: Release, change: str) -> str:
    """helm upgrade changing the pod annotation or the image tag (the same image tagged anew in containerd); what
    the new pod must show for it."""
    if change == "image":
        tag = release.image.name.rsplit(":", 1)[1] + "-rollout"
        target = f"{release.image.name.rsplit(':', 1)[0]}:{tag}"
        cluster.ctr("images", "tag", "--force", release.image.name, target)
        setting, expected = f"image.tag={tag}", f":{tag}"
    else:
        setting, expected = "podAnnotations.ix-e2e-rollout=annotation", "annotation"
    args = ["upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values", "--set-string", setting]
    release.helm(*args)
    return expected


def shows(pod: Obj, change: str, expected: str) -> bool:
    if change == "image":  # the spec's: containerd names the image by its first tag, the one the build gave it
        return pod["spec"]["containers"][0]["image"].endswith(expected)
    return pod["metadata"].get("annotations", {}).get("ix-e2e-rollout") == expected


def registered_beside(admin: Kubectl, old_uid: str) -> tuple[Obj, Obj] | None:
    """The old pod (still Ready, not terminating) and a new one that has registered beside it, once there is one."""
    pods = {pod["metadata"]["uid"]: pod for pod in plugin_pods(admin)}
    old = pods.pop(old_uid, None)
    if old is None or not ready(old) or len(pods) != 1:
        return None
    (new,) = pods.values()
    if new.get("status", {}).get("phase") != "Running" or not pod_says(new, "/readyz").startswith("ok: registered"):
        return None
    logs = admin("logs", new["metadata"]["name"], "-n", NAMESPACE, timeout=30)
    assert SURGE_FROM_THE_NODE in logs, logs[-3000:]
    return old, new


def beside_without_a_drop(admin: Kubectl, recorder: ResourceRecorder, old_uid: str) -> tuple[Obj, Obj] | None:
    """registered_beside, failing (named in the wait's timeout) once the kubelet's allocatable has moved: a new pod
    that waits on standby instead (auto without the Node's kubeletVersion) has the old one deleted once it is Ready,
    and the node has no GPU until it registers."""
    assert set(recorder.seen(KUBELET)) <= {(None, 3)}, f"the kubelet's allocatable went {recorder.seen(KUBELET)}"
    return registered_beside(admin, old_uid)


def settled(admin: Kubectl, uid: str | None = None, not_uid: str | None = None) -> Obj | None:
    """The one plugin pod once the DaemonSet's rollout is over (its status says so), Ready; with uid, that pod, with
    not_uid, another."""
    pod = one_ready_pod(admin)
    if pod is None or (uid or pod["metadata"]["uid"]) != pod["metadata"]["uid"] or pod["metadata"]["uid"] == not_uid:
        return None
    daemonset = admin.get("daemonset", "iluvatar-device-plugin", NAMESPACE)
    status = daemonset["status"]
    done = status.get("observedGeneration") == daemonset["metadata"]["generation"] and (
        status.get("updatedNumberScheduled"),
        status.get("numberAvailable"),
        status.get("numberUnavailable", 0),
    ) == (1, 1, 0)
    return pod if done else None


def test_the_plugin_pod_reports_the_chip_out_as_a_node_event_with_its_own_token(
    cluster: Cluster, admin: Kubectl, out_of_service: str
) -> None:
    """The pod has no credential but the chart's ServiceAccount token, and reaches the API server only through the
    `kubernetes` Service: the XID's Node Events (the chart's default self-healing) are its own calls."""

    def reported() -> set[str]:
        return {e["reason"] for e in node_events(admin, cluster.node_name) if OUT.uuid in e["message"]}

    until(lambda: {"GPUXidError", "GPUNeedsOperator"} <= reported(), 30, "the XID's Node Events", [])
    (pod,) = plugin_pods(admin)
    assert "Forbidden" not in admin("logs", pod["metadata"]["name"], "-n", NAMESPACE, timeout=30)


@pytest.mark.parametrize("change", ["annotation", "image"])
def test_a_helm_upgrade_rolls_the_daemonset_without_a_drop_and_keeps_the_chip_out(
    cluster: Cluster, admin: Kubectl, namespace: str, release: Release, out_of_service: str, change: str
) -> None:
    old = until(lambda: one_ready_pod(admin), 120, "one plugin pod Ready", kubelet_log(cluster))
    wait_offered(cluster, 4, 3)
    before = gpu_pod(admin, namespace, "before")
    with ResourceRecorder(cluster, RESOURCE) as recorder:
        expected = upgrade(cluster, release, change)
        overlap = until(
            lambda: beside_without_a_drop(admin, recorder, old["metadata"]["uid"]),
            ROLLOUT,
            "a new plugin pod registered beside the old one",
            kubelet_log(cluster),
        )
        during = gpu_pod(admin, namespace, "during")
        assert during != before
        old_now = admin.get_or_none("pod", old["metadata"]["name"], NAMESPACE)
        assert old_now is not None and ready(old_now), "the old plugin pod went before the pod of the overlap ran"
        old_pod, new_pod = overlap
        assert (acting(old_pod), acting(new_pod)) == (1.0, 0.0)
        calls = pod_metric(new_pod, "ix_device_plugin_calls_total", method="Allocate")
        assert calls == 1.0, "the new pod, the newest registration, answers the Allocate of the overlap"
        old_uid = old["metadata"]["uid"]
        new = until(lambda: settled(admin, not_uid=old_uid), ROLLOUT, "the rollout", kubelet_log(cluster))
        assert new["metadata"]["uid"] == new_pod["metadata"]["uid"] and shows(new, change, expected)
        until(lambda: acting(new) == 1.0, 10, "the new pod acting for the node", [])
        assert pod_metric(new, "ix_device_plugin_devices", resource=RESOURCE, health="Unhealthy") == 1.0
    summary = {"change": change, "record_phase": out_of_service, **recorder.summary()}
    (cluster.logdir / f"daemonset-rollout-{change}.json").write_text(json.dumps(summary, indent=2))
    print(f"daemonset rollout ({change}): {json.dumps(summary)}")
    recorder.check_steady(4, 3)
    assert recorded(release) is not None, node_health(release.plugins_dir)
    for name in ("before", "during"):
        status = admin.get("pod", name, namespace)["status"]
        assert status["phase"] == "Running" and status["containerStatuses"][0]["restartCount"] == 0, (name, status)


def test_a_rollout_undone_while_both_pods_run_leaves_the_old_pod_serving(
    cluster: Cluster, admin: Kubectl, namespace: str, release: Release, out_of_service: str
) -> None:
    """The kubelet's "DP2 changed its mind" as the DaemonSet runs it: a helm upgrade starts a new pod beside the old
    one, and `helm rollback` while both run (the new one registered, not yet Ready) has the controller delete the new
    one; the old pod acts for the node on and the kubelet turns back to it for the next pod; nothing drops."""
    old = until(lambda: one_ready_pod(admin), 120, "one plugin pod Ready", kubelet_log(cluster))
    old_uid = old["metadata"]["uid"]
    wait_offered(cluster, 4, 3)
    with ResourceRecorder(cluster, RESOURCE) as recorder:
        release.helm(
            "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values",
            "--set-string", "podAnnotations.ix-e2e-rollout=undone",
        )  # fmt: skip
        _, new_pod = until(
            lambda: beside_without_a_drop(admin, recorder, old_uid),
            ROLLOUT,
            "a new plugin pod beside the old one",
            kubelet_log(cluster),
        )
        allocations = pod_metric(old, "ix_device_plugin_calls_total", method="Allocate") or 0.0
        release.helm("rollback", RELEASE, "--namespace", NAMESPACE)
        until(lambda: settled(admin, uid=old_uid), ROLLOUT, "the rollout undone", kubelet_log(cluster))
        assert admin.get_or_none("pod", new_pod["metadata"]["name"], NAMESPACE) is None
        after = gpu_pod(admin, namespace, "after")
        assert pod_metric(old, "ix_device_plugin_calls_total", method="Allocate") == allocations + 1
        assert acting(old) == 1.0
    summary = {"change": "undone", "record_phase": out_of_service, "chip": after, **recorder.summary()}
    (cluster.logdir / "daemonset-rollout-undone.json").write_text(json.dumps(summary, indent=2))
    print(f"daemonset rollout (undone): {json.dumps(summary)}")
    recorder.check_steady(4, 3)
    assert recorded(release) is not None, node_health(release.plugins_dir)
