"""What every lane (e2e/lanes/, and the default lane) must show, as a user would meet it on that cluster: the GPUs
served by the chart's default values, by the static file applied over a running Iluvatar 4.4.0 DaemonSet, after
`helm upgrade` from the previous release, and by the chart installed beside Iluvatar's chart, through that one's
uninstall; never a pod waiting in Init.

Where the lane's runtime serves NRI, the agent runs unprivileged (CapEff 0, its injector giving it the nodes) and
labels its node iluvatar.com/gpu.device-access=nri. Where it does not (containerd 1.7 as shipped, containerd 2.x with
NRI off), the unprivileged agent says why in one line, labels its node `privileged`, and the chart's privileged
DaemonSet takes the node over and serves its GPUs. On those lanes the negative control: strict mode, no GPUs, the one
line, the label `none`, one Node Event, and the agent running (not restarting, not in Init).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from harness.build import REPO_ROOT, versions
from harness.cluster import Cluster
from harness.helm import CHART, load_objects, node_values, static_objects
from harness.kube import Kubectl, KubectlError, Obj
from harness.nodewatch import KUBELET, ResourceRecorder
from harness.plugin import devices_yaml, write_atomically
from harness.pods import SHOW_DEVICES, STAY, busybox_pod, node_resource, run_and_read, shown_devices
from harness.project_image import BuiltImage
from harness.release import (
    ACCESS_LABEL,
    CHIPS,
    FALLBACK_SUFFIX,
    GPU_LABEL,
    NAMESPACE,
    PLUGIN,
    RELEASE,
    access_events,
    agent_pods,
    assert_unprivileged_as_run,
    forget_node_labels,
    in_init,
    installed,
    kubelet_log,
    node_label,
    running_pod,
)
from harness.waits import until

RESOURCE = "iluvatar.com/gpu"
NRI_ON = versions().get("CONTAINERD_NRI", "on") != "off"
ACCESS = "nri" if NRI_ON else "privileged"  # what the node is labelled with the chart's defaults
SERVING = PLUGIN if NRI_ON else PLUGIN + FALLBACK_SUFFIX  # whose pod serves the node then
OUT = CHIPS[3]  # gets an XID 64 (it needs an operator: no reset races the check)
# The chart of the release before this one: the last release's commit on main. Bump it with each release.
PREVIOUS_RELEASE = "75e3c21bc541692cefed777d4b5d42e1426c2598"
VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
ROLLOUT = 300  # seconds a rollout may take on a busy 2-core machine
SHORT_GAP = 30.0  # seconds an older kubelet may go without the resource while one plugin hands over to another


def serves_its_gpus(cluster: Cluster, admin: Kubectl, namespace: str, devices: Path) -> None:
    """The node labelled as the lane allows, the right DaemonSet's pod serving 4 split chips, a pod given one with its
    device node and variables, and an XID 64 taking a chip out; no agent pod in Init."""
    until(lambda: node_label(admin, cluster.node_name) == ACCESS, 180, f"{ACCESS_LABEL}={ACCESS}", kubelet_log(cluster))
    pod = running_pod(cluster, SERVING)
    if NRI_ON:
        assert_unprivileged_as_run(admin, pod, PLUGIN)
    else:
        assert pod["spec"]["containers"][0]["securityContext"].get("privileged") is True
        assert "initContainers" not in pod["spec"]
        until(lambda: agent_pods(admin, PLUGIN) == [], 120, "no unprivileged agent pod left on the node", [])
    until(
        lambda: node_resource(admin, cluster.node_name, RESOURCE) == (4, 4), 120, f"{RESOURCE}: 4", kubelet_log(cluster)
    )
    _, output = run_and_read(admin, namespace, busybox_pod("allocated", SHOW_DEVICES + STAY, gpus=1))
    nodes, env = shown_devices(output)
    (node,) = [path for path in nodes if path.startswith("/dev/iluvatar")]
    chip = next(c for c in CHIPS if f"/dev/iluvatar{c.minor}" == node)
    assert env["IX_VISIBLE_DEVICES"] == chip.uuid and "/dev/itrctl" in nodes, (nodes, env)
    admin.delete("pod", "allocated", namespace)
    write_atomically(devices, devices_yaml([replace(OUT, xids=(64,)) if c == OUT else c for c in CHIPS]))
    until(lambda: node_resource(admin, cluster.node_name, RESOURCE) == (4, 3), 60, f"{RESOURCE}: 3 after an XID 64", [])
    assert in_init(admin) == []


def test_the_chart_with_default_values_serves_the_gpus_the_narrowest_way_the_node_allows(
    cluster: Cluster, admin: Kubectl, namespace: str, project_image: BuiltImage, tmp_path: Path
) -> None:
    with installed(cluster, tmp_path, {}) as release:
        serves_its_gpus(cluster, admin, namespace, release.devices)


def test_helm_upgrade_from_the_previous_release_serves_the_gpus(
    cluster: Cluster, admin: Kubectl, namespace: str, project_image: BuiltImage, tmp_path: Path
) -> None:
    previous = previous_chart(tmp_path / "previous")
    # The release before rendered its admission policies unconditionally: where the API server has none, its users
    # could install it only without the features that bring them.
    older: dict[str, Any] = {} if served(admin, VAP) else {"features": {"selfHealing": False}}
    with installed(cluster, tmp_path, older, chart=previous) as release:
        values = {key: value for key, value in release.values.items() if key != "features"}  # the new defaults
        release.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
                     "--values", str(release.helm.values_file(values, "upgrade")))  # fmt: skip
        serves_its_gpus(cluster, admin, namespace, release.devices)


def test_the_static_file_applied_over_a_running_4_4_0_daemonset_completes_its_rollout(
    cluster: Cluster, admin: Kubectl, namespace: str, project_image: BuiltImage, tmp_path: Path
) -> None:
    corex = tmp_path / "corex"
    corex.mkdir()
    devices = corex / "devices.yaml"
    devices.write_text(devices_yaml(CHIPS))
    with node_labelled(cluster), applied_4_4_0(admin, project_image, devices):
        until(lambda: node_resource(admin, cluster.node_name, RESOURCE) == (4, 4), 180, "4.4.0 serving", [])
        files = ["ix-config.yaml", "ix-device-plugin.yaml"]
        if served(admin, VAP):
            files.append("ix-device-plugin-admission.yaml")
        ours = localized(static_objects(files), cluster, tmp_path, devices)
        admin.apply(ours)
        try:
            for name in (PLUGIN, PLUGIN + FALLBACK_SUFFIX):
                admin("rollout", "status", f"ds/{name}", "-n", NAMESPACE, f"--timeout={ROLLOUT}s", timeout=ROLLOUT + 30)
            serves_its_gpus(cluster, admin, namespace, devices)
            assert not [p for p in agent_pods(admin, PLUGIN) + agent_pods(admin, SERVING) if is_4_4_0(p)]
        finally:
            for obj in reversed(ours):
                admin.delete(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"), wait=False)
            until(lambda: agent_pods(admin, SERVING) == [], 120, "the agent's pods gone", [])


def test_helm_install_beside_iluvatars_chart_and_its_uninstall_keep_the_gpus_served(
    cluster: Cluster, admin: Kubectl, namespace: str, project_image: BuiltImage, tmp_path: Path
) -> None:
    """Iluvatar's chart (release ix-device-plugin: the DaemonSet ix-device-plugin, the ConfigMap ix-config) runs;
    ours is installed beside it reading the same ConfigMap (config.create=false), then Iluvatar's is uninstalled. The
    GPUs stay served: on a kubelet 1.37+ without a drop (both register, the newest serves), on an older one with the
    short gap of its stop, no longer than SHORT_GAP."""
    corex = tmp_path / "iluvatar-corex"
    corex.mkdir()
    theirs = corex / "devices.yaml"
    theirs.write_text(devices_yaml(CHIPS))
    release = {"app.kubernetes.io/name": "ix-device-plugin", "app.kubernetes.io/instance": "ix-device-plugin"}
    with node_labelled(cluster), applied_4_4_0(admin, project_image, theirs, name="ix-device-plugin", labels=release):
        until(lambda: node_resource(admin, cluster.node_name, RESOURCE) == (4, 4), 180, "Iluvatar's chart serving", [])
        with (
            ResourceRecorder(cluster, RESOURCE) as recorder,
            installed(cluster, tmp_path, {"config": {"create": False}}, release="iluvatar") as ours,
        ):
            until(lambda: node_label(admin, cluster.node_name) == ACCESS, 180, f"{ACCESS_LABEL}={ACCESS}", [])
            running_pod(cluster, SERVING)
            admin.delete("daemonset", "ix-device-plugin", NAMESPACE)
            until(lambda: not [p for p in agent_pods(admin, "ix-device-plugin")], 120, "Iluvatar's pod gone", [])
            until(lambda: node_resource(admin, cluster.node_name, RESOURCE) == (4, 4), 120, "ours serving alone", [])
            write_atomically(ours.devices, devices_yaml([replace(OUT, xids=(64,)) if c == OUT else c for c in CHIPS]))
            until(lambda: node_resource(admin, cluster.node_name, RESOURCE) == (4, 3), 60, "ours taking a chip out", [])
            served_until = time.monotonic()  # ours is uninstalled next: judged until here
        gap = longest_drop(recorder, below=3, until=served_until)
        if kubelet_keeps_several_endpoints():
            assert gap == 0.0, f"the kubelet's allocatable dropped for {gap:.1f} s: {recorder.summary()}"
        else:
            assert gap <= SHORT_GAP, f"the kubelet's allocatable dropped for {gap:.1f} s: {recorder.summary()}"


if not NRI_ON:

    def test_strict_mode_without_nri_gives_no_gpus_and_says_why_once(
        cluster: Cluster, admin: Kubectl, project_image: BuiltImage, tmp_path: Path
    ) -> None:
        before = access_events(admin, cluster.node_name)
        with installed(cluster, tmp_path, {"strict": True}):
            until(
                lambda: node_label(admin, cluster.node_name) == "none",
                180,
                f"{ACCESS_LABEL}=none",
                kubelet_log(cluster),
            )
            (event,) = until(
                lambda: access_events(admin, cluster.node_name, not_in=before),
                60,
                "one GPUDeviceAccessMissing Event",
                [],
            )
            assert "no NRI socket" in event["message"] and "strict mode" in event["message"], event["message"]
            pod = running_pod(cluster, PLUGIN)
            logs = admin("logs", pod["metadata"]["name"], "-n", NAMESPACE, "-c", PLUGIN)
            said = [line for line in logs.splitlines() if "device access: " in line and "no NRI socket" in line]
            assert len(said) == 1, logs
            injector = admin("logs", pod["metadata"]["name"], "-n", NAMESPACE, "-c", "nri-injector")
            assert len([line for line in injector.splitlines() if "no NRI socket" in line]) == 1, injector
            assert pod["status"]["containerStatuses"][0]["restartCount"] == 0 and in_init(admin) == []
            assert agent_pods(admin, PLUGIN + FALLBACK_SUFFIX) == []  # nothing privileged
            assert node_resource(admin, cluster.node_name, RESOURCE)[1] == 0


# ---------------------------------------------------------------------- helpers


def kubelet_keeps_several_endpoints() -> bool:
    """A kubelet 1.37+ keeps one endpoint per socket of a resource: a plugin registering beside another cuts nothing."""
    major, minor = versions()["KUBERNETES_VERSION"].removeprefix("v").split(".")[:2]
    return (int(major), int(minor)) >= (1, 37)


def longest_drop(recorder: ResourceRecorder, below: int, until: float) -> float:
    """The longest time (seconds) the kubelet's allocatable devices were fewer than below, up to until (monotonic)."""
    longest, since = 0.0, None
    samples = [sample for sample in recorder.of(KUBELET) if sample.at <= until]
    for sample in samples:
        if sample.allocatable < below and since is None:
            since = sample.at
        elif sample.allocatable >= below and since is not None:
            longest, since = max(longest, sample.at - since), None
    if since is not None:
        longest = max(longest, samples[-1].at - since)
    return longest


def served(admin: Kubectl, resource: str) -> bool:
    """Whether the API server serves group/version/Kind (as helm's .Capabilities.APIVersions.Has reads it)."""
    group_version, kind = resource.rsplit("/", 1)
    with contextlib.suppress(KubectlError):
        listed = admin("api-resources", f"--api-group={group_version.split('/')[0]}", "-o", "wide")
        return any(kind in line and group_version in line for line in listed.splitlines())
    return False


def previous_chart(where: Path) -> Path:
    """The chart of PREVIOUS_RELEASE, taken from the repository's history into where (with the dashboard it links)."""
    where.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", PREVIOUS_RELEASE, "deployments"],
        capture_output=True,
        check=False,
    )
    assert archive.returncode == 0, f"the previous release's chart ({PREVIOUS_RELEASE}): {archive.stderr.decode()}"
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where / "deployments" / "helm" / "ix-device-plugin"


@contextlib.contextmanager
def node_labelled(cluster: Cluster) -> Iterator[None]:
    cluster.admin("label", "node", cluster.node_name, f"{GPU_LABEL}=true", "--overwrite")
    try:
        yield
    finally:
        forget_node_labels(cluster, GPU_LABEL)


def daemonset_4_4_0(image: str, devices: Path, name: str = PLUGIN, labels: dict[str, str] | None = None) -> list[Obj]:
    """Iluvatar's 4.4.0 static install as its README gives it (privileged, the host's /dev, /sys and /run/udev, the
    fixed socket iluvatar-gpu.sock: no POD_UID), running this image as root over the simulated chips (the 4.4.0 image
    is not here): the shape the static file is applied over. name and labels: its chart's instead (a release of
    Iluvatar's chart names the DaemonSet after the release and selects by name and instance)."""
    selector = labels or {"app.kubernetes.io/name": PLUGIN}
    mounts = {
        "device-plugin": "/var/lib/kubelet/device-plugins",
        "sys": "/sys",
        "dev": "/dev",
        "corex": str(devices.parent),
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ix-config", "namespace": NAMESPACE},
            "data": {"ix-config": "flags:\n  splitboard: true\n"},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": selector},
            "spec": {
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": {**selector, "ix-e2e/shape": "4.4.0"}},
                    "spec": {
                        "priorityClassName": "system-node-critical",
                        "containers": [
                            {
                                "name": "ix-device-plugin",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                # uid 0: 4.4.0's image runs as root; this image's default user is 10001
                                "securityContext": {
                                    "privileged": True,
                                    "runAsUser": 0,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "env": [
                                    {"name": "IX_BACKEND", "value": "simulated"},
                                    {"name": "IX_SIMULATED_DEVICES", "value": str(devices)},
                                    {"name": "IX_HEALTH_INTERVAL", "value": "0.5"},
                                    {"name": "IX_CDI_SPEC_DIR", "value": "off"},
                                    {"name": "IX_NODE_FEATURE_DIR", "value": "off"},
                                    {"name": "IX_TELEMETRY_INTERVAL", "value": "off"},
                                    {"name": "IX_HEALTH_ADDRESS", "value": "off"},
                                    {"name": "IX_CONFIG", "value": "/ixconfig/ix-config"},
                                ],
                                "volumeMounts": [
                                    *({"name": name, "mountPath": path} for name, path in mounts.items()),
                                    {"name": "ixc", "mountPath": "/ixconfig"},
                                ],
                                "terminationMessagePath": "/tmp/termination-log",
                            }
                        ],
                        "volumes": [
                            *({"name": name, "hostPath": {"path": path}} for name, path in mounts.items()),
                            {"name": "ixc", "configMap": {"name": "ix-config"}},
                        ],
                    },
                },
            },
        },
    ]


@contextlib.contextmanager
def applied_4_4_0(admin: Kubectl, image: BuiltImage, devices: Path, **shape: Any) -> Iterator[None]:
    objects = daemonset_4_4_0(image.name, devices, **shape)
    admin.apply(objects)
    try:
        yield
    finally:
        for obj in objects:
            admin.delete(obj["kind"], obj["metadata"]["name"], NAMESPACE, wait=False)


def is_4_4_0(pod: Obj) -> bool:
    return pod["metadata"].get("labels", {}).get("ix-e2e/shape") == "4.4.0"


def localized(objects: list[Obj], cluster: Cluster, workdir: Path, devices: Path) -> list[Obj]:
    """The static file's objects as a user of this node applies them: its kubelet's folders where the static file says
    /var/lib/kubelet, the simulated backend over devices instead of IXML, and the simulated nodes' major for the
    injector (the only edits)."""
    plugins = workdir / "kubelet-plugins"
    values = node_values(cluster, workdir, plugins, simulated_devices=str(devices))
    paths = {
        "/var/lib/kubelet/device-plugins": values["devicePluginPath"],
        "/var/lib/kubelet/plugins": values["kubeletPluginsPath"],
        "/var/lib/kubelet/pod-resources": values["telemetry"]["podResources"]["dir"],
        "/var/run/cdi": values["cdi"]["specDir"],
        "/usr/local/corex": values["corexPath"],
        "/etc/kubernetes/node-feature-discovery/features.d": values["nodeFeatures"]["dir"],
    }
    extra = {item["name"]: item["value"] for item in values["extraEnv"]}
    text = "---\n".join(_dump(obj) for obj in objects)
    for old, new in sorted(paths.items(), key=lambda item: -len(item[0])):
        text = text.replace(old, new)
    result = load_objects(text)
    for obj in result:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "ix-config":
            obj["data"]["ix-config"] = values["config"]["content"]
        if obj["kind"] != "DaemonSet":
            continue
        pod = obj["spec"]["template"]["spec"]
        for container in pod["containers"]:
            env = [e for e in container.get("env", []) if e["name"] not in ("IX_BACKEND", *extra)]
            env += [{"name": "IX_BACKEND", "value": "simulated"}]
            env += [{"name": name, "value": value} for name, value in extra.items()]
            container["env"] = env
        for container in (c for c in pod.get("initContainers", []) if c["name"] == "nri-injector"):
            majors = ",".join(map(str, values["nriInjector"]["deviceMajors"]))
            container["env"] = [*container.get("env", []), {"name": "DEVICE_MAJORS", "value": majors}]
    return result


def _dump(obj: Obj) -> str:
    return yaml.safe_dump(obj, sort_keys=False)
