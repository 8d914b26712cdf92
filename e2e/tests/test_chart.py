"""The Helm chart with the real helm and the real API server: lint, the rendered objects against the static
manifests, every object accepted by server-side dry run, and the plugin's API features run with the chart's
ServiceAccount token, each allowed by the chart's RBAC, and what the chart does not grant refused.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import volcano
from harness.cluster import Cluster
from harness.dra import pod_bound_kubeconfig
from harness.helm import CHART, Helm, by_key, load_objects, of_kind, static_objects
from harness.kube import Kubectl, KubectlError, Obj
from harness.plugin import PluginRun, bi_v150_chips, fake_ixsmi, ixsmi_calls, node_events, start_device_plugin
from harness.pods import (
    SHOW_DEVICES,
    STAY,
    busybox_pod,
    node_resource,
    phase_is,
    run_and_read,
    running_and_printed,
    shown_devices,
    wait_pod,
)
from harness.procs import run
from harness.waits import stays, until

RESOURCE = "iluvatar.com/gpu"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "iluvatar-device-plugin"
FEATURES = {"features": {"perNodeConfig": True, "gpuReset": True, "volcano": True, "selfHealing": True}}
REFUSED_REASON = "VolcanoAnnotationRefused"  # deviceplugin/features/volcanotrust.py
HEALING_STEPS = ("GPUXidError", "GPUUnhealthy", "GPUHealingWaiting", "GPUHealingReset", "GPUHealthy")
# Value sets the chart is rendered with; every object of each must be accepted by the API server.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "api-features": FEATURES,
    "dra": {"dra": {"enabled": True, "extendedResourceName": RESOURCE}, "devicePlugin": {"enabled": False}},
    "metrics-dashboard": {"metrics": {"enabled": True}, "dashboard": {"enabled": True}},
    "network-policy": {
        "networkPolicy": {"enabled": True, "metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]},
        "dra": {"enabled": True},
    },
    "simulated-cdi-off": {"backend": "simulated", "cdi": {"enabled": False}, "nodeFeatures": {"enabled": False}},
}
# The Prometheus Operator's CRD is not part of Kubernetes: its ServiceMonitor cannot be dry-run here.
NOT_BUILT_IN = {"ServiceMonitor"}
# The chart renders its admission policies only where the cluster serves them (1.30+), as this one does: helm install
# reads that from the API server, helm template is told it (scripts/helm_chart.py POLICY_API).
POLICY_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
# The static files of each mode: without the admission policies (Kubernetes 1.29), and the policies' file (1.30+).
STATIC_FILES = ["ix-config.yaml", "ix-device-plugin.yaml"]
DRA_STATIC_FILES = ["ix-config.yaml", "ix-dra-driver.yaml"]
ADMISSION_FILES = {
    "ix-device-plugin.yaml": "ix-device-plugin-admission.yaml",
    "ix-dra-driver.yaml": "ix-dra-driver-admission.yaml",
}


def template(helm: Helm, values: dict[str, Any] | None = None) -> list[Obj]:
    """The chart's objects as helm install renders them on this cluster: with the admission policies."""
    args = ["template", "ix-device-plugin", str(CHART), "--namespace", NAMESPACE, "--api-versions", POLICY_API]
    if values:
        args += ["--values", str(helm.values_file(values))]
    return load_objects(helm(*args))


def with_admission(names: list[str]) -> list[str]:
    """The static files and their admission policies' files."""
    return [*names, *(ADMISSION_FILES[name] for name in names if name in ADMISSION_FILES)]


@pytest.fixture(scope="module")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(cluster.binaries["helm"], tmp_path_factory.mktemp("helm"), cluster.kubeconfig("admin"))


def test_helm_lint_passes_strict_for_every_value_set(helm: Helm) -> None:
    for values in VALUE_SETS.values():
        assert "0 chart(s) failed" in helm.lint(values)


@pytest.mark.parametrize("policies", [False, True], ids=["1.29", "1.30+"])
def test_the_chart_with_default_values_renders_the_static_manifests(helm: Helm, policies: bool) -> None:
    rendered = by_key(template(helm) if policies else helm.template())
    static = by_key(static_objects(with_admission(STATIC_FILES) if policies else STATIC_FILES))
    assert sorted(rendered) == sorted(static)
    for key, obj in static.items():
        assert rendered[key] == obj, key


@pytest.mark.parametrize("policies", [False, True], ids=["1.29", "1.30+"])
def test_the_chart_in_dra_mode_renders_the_static_dra_manifest(helm: Helm, policies: bool) -> None:
    values = {"dra": {"enabled": True}, "devicePlugin": {"enabled": False}}
    rendered = by_key(template(helm, values) if policies else helm.template(values))
    static = by_key(static_objects(with_admission(DRA_STATIC_FILES) if policies else DRA_STATIC_FILES))
    assert sorted(rendered) == sorted(static)
    for key, obj in static.items():
        assert rendered[key] == obj, key


def test_the_helm_backed_chart_check_passes(cluster: Cluster) -> None:
    """scripts/helm_chart.py (render_chart.py's successor) agrees: chart and static files are the same objects."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "helm_chart.py"
    env = dict(os.environ, HELM=str(cluster.binaries["helm"]))
    result = run([sys.executable, str(script), "check"], env=env)
    assert "chart renders the static manifests (helm template)" in result.stdout


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_rendered_object_is_accepted_by_the_api_server(helm: Helm, admin: Kubectl, value_set: str) -> None:
    objects = [obj for obj in template(helm, VALUE_SETS[value_set]) if obj["kind"] not in NOT_BUILT_IN]
    assert objects
    output = admin.apply(objects, "--dry-run=server")
    for obj in objects:
        assert f"{obj['metadata']['name']} serverside-applied (server dry run)" in output


def test_the_static_manifests_are_accepted_by_the_api_server(admin: Kubectl) -> None:
    names = [*with_admission(["ix-config.yaml", "ix-device-plugin.yaml", "ix-dra-driver.yaml"]), "corex-example.yaml"]
    objects = static_objects(names)
    output = admin.apply(objects, "--dry-run=server")
    assert output.count("(server dry run)") == len(objects)


def test_the_server_rejects_what_the_schema_forbids(helm: Helm, admin: Kubectl) -> None:
    """The dry run is a real check: a misspelt field in the DaemonSet is refused (strict field validation)."""
    (daemonset,) = [d for d in of_kind(helm.template(), "DaemonSet") if d["metadata"]["name"] == SERVICE_ACCOUNT]
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")
    with pytest.raises(KubectlError, match="volumeMount: field not declared in schema"):
        admin.apply(daemonset, "--dry-run=server", "--validate=strict")


# ------------------------------------------------------------------ API features with the chart's RBAC


@pytest.fixture(scope="module")
def chart_account(cluster: Cluster, helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The chart's ServiceAccount, RBAC and admission policies for every API feature, applied; a kubeconfig with
    its token bound to a pod on the node, as the DaemonSet's pod has one (the policies refuse a token without a node).
    """
    objects = [obj for obj in template(helm, FEATURES) if obj["kind"] not in {"DaemonSet", "ConfigMap"}]
    assert {obj["kind"] for obj in objects} >= {"ServiceAccount", "ClusterRole", "Role", "ValidatingAdmissionPolicy"}
    cluster.admin.apply(objects)
    directory = tmp_path_factory.mktemp("chart-token")
    pod = f"{SERVICE_ACCOUNT}-{directory.name}"
    try:
        yield pod_bound_kubeconfig(cluster, NAMESPACE, SERVICE_ACCOUNT, pod, directory / "kubeconfig")
    finally:
        cluster.admin.delete("pod", pod, NAMESPACE, wait=False)
        for obj in reversed(objects):
            cluster.admin.delete(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"), wait=False)
        for name in (f"ix-gpu-reset-{cluster.node_name}", f"ix-device-info-cm-{cluster.node_name}"):
            cluster.admin.delete("configmap", name, NAMESPACE, wait=False)


def start_with_account(
    cluster: Cluster, workdir: Path, name: str, kubeconfig: Path, config: dict[str, Any], extra: list[str]
) -> PluginRun:
    started = start_device_plugin(
        cluster, workdir, name, config=config, extra=["--kubeconfig", str(kubeconfig), *extra]
    )
    started.wait_ready()
    return started


def wait_capacity(cluster: Cluster, plugin: PluginRun, count: int) -> None:
    until(
        lambda: node_resource(cluster.admin, cluster.node_name, RESOURCE) == (count, count),
        60,
        f"{RESOURCE} capacity {count}",
        [plugin.process.log],
    )


def no_refusals(plugin: PluginRun) -> None:
    """The plugin's log shows no API call refused (the chart's RBAC granted everything it did)."""
    text = plugin.process.log_text()
    assert "Forbidden" not in text and " 403" not in text, text[-3000:]


def test_per_node_config_follows_the_node_label_with_the_charts_rbac(
    cluster: Cluster, admin: Kubectl, chart_account: Path, tmp_path: Path
) -> None:
    plugin = start_with_account(
        cluster, tmp_path / "p", "chart-per-node", chart_account, {}, ["--per-node-config", "true"]
    )
    try:
        (tmp_path / "p" / "split").write_text(yaml.safe_dump({"flags": {"splitboard": True}}))
        wait_capacity(cluster, plugin, 2)
        admin("label", "node", cluster.node_name, "iluvatar.com/device-plugin.config=split")
        wait_capacity(cluster, plugin, 4)
        admin("label", "node", cluster.node_name, "iluvatar.com/device-plugin.config-")
        wait_capacity(cluster, plugin, 2)
        no_refusals(plugin)
    finally:
        admin("label", "node", cluster.node_name, "iluvatar.com/device-plugin.config-")
        plugin.stop()


def test_gpu_reset_handshake_with_the_charts_rbac(
    cluster: Cluster, admin: Kubectl, namespace: str, chart_account: Path, tmp_path: Path
) -> None:
    """The simulated backend resets chips itself (no ixsmi); the handshake around it is the real one."""
    plugin = start_with_account(
        cluster, tmp_path / "p", "chart-gpu-reset", chart_account, {"flags": {"reset_gpu": True}}, []
    )
    try:
        handshake = f"ix-gpu-reset-{cluster.node_name}"
        announced = until(
            lambda: admin.get_or_none("configmap", handshake, NAMESPACE), 30, handshake, [plugin.process.log]
        )
        assert yaml.safe_load(announced["data"]["gpuReset"])["occupy"]["ix-device-plugin"] is True
        _, output = run_and_read(admin, namespace, busybox_pod("reset", SHOW_DEVICES + STAY, gpus=1))
        visible = shown_devices(output)[1]["IX_VISIBLE_DEVICES"]
        assert f"GPU reset of {visible}: ok" in plugin.process.log_text()
        state = yaml.safe_load(admin.get("configmap", handshake, NAMESPACE)["data"]["gpuReset"])
        assert state["nodename"] == cluster.node_name and state["reset"] is False
        assert state["occupy"]["ix-device-plugin"] is True
        assert 'ix_device_plugin_gpu_resets_total{result="ok"} 1.0' in plugin.metrics()
        no_refusals(plugin)
    finally:
        plugin.stop()


def test_volcano_mode_with_the_charts_rbac(
    cluster: Cluster, admin: Kubectl, namespace: str, chart_account: Path, tmp_path: Path
) -> None:
    chips = bi_v150_chips()
    plugin = start_with_account(
        cluster, tmp_path / "p", "chart-volcano", chart_account, {"flags": {"usevolcano": True}}, []
    )
    try:
        info_name = f"ix-device-info-cm-{cluster.node_name}"

        def published() -> Obj | None:
            found = admin.get_or_none("configmap", info_name, NAMESPACE)
            return found if found and "DeviceListCfg" in found.get("data", {}) else None

        info = until(published, 30, info_name, [plugin.process.log])
        assert set(json.loads(info["data"]["DeviceInfoCfg"])["DeviceInfo"]) == {chips[0].uuid, chips[2].uuid}
        chosen = chips[2].uuid  # what Volcano's scheduler would have written: the second board
        pod = busybox_pod("volcano", SHOW_DEVICES + STAY, gpus=1)
        pod["spec"]["schedulerName"] = volcano.SCHEDULER_NAME  # it waits for Volcano's scheduler
        admin.create(pod, "-n", namespace)
        # Volcano's scheduler's two steps, with its account (the chart's admission policy lets only it and the plugin
        # write these keys): its choice in the annotations (field manager vc-scheduler), then the binding.
        with volcano.volcano_scheduler(cluster, tmp_path / "volcano.kubeconfig") as scheduler:
            volcano.annotate(
                scheduler, namespace, "volcano", {volcano.DEV_VOLCANO: chosen, volcano.PREDICATE_TIME: "1"}
            )
            volcano.bind(scheduler, namespace, "volcano", cluster.node_name)
        printed = running_and_printed(admin, namespace)
        wait_pod(admin, namespace, "volcano", printed, "printed its devices", 120, [plugin.process.log])
        output = admin("logs", "volcano", "-n", namespace)
        assert shown_devices(output)[1]["IX_REPLICA_DEVICES"] == chosen

        def annotated() -> dict[str, str] | None:
            notes = admin.get("pod", "volcano", namespace)["metadata"]["annotations"]
            return notes if "iluvatar.com/DevRealAlloc" in notes else None

        notes = until(annotated, 60, "DevKubelet/DevRealAlloc annotations", [plugin.process.log])
        assert notes["iluvatar.com/DevRealAlloc"] == chosen
        assert notes["predicate-time"] == str(2**64 - 1)
        no_refusals(plugin)
    finally:
        plugin.stop()


def test_a_tenants_forged_volcano_annotations_are_refused(
    cluster: Cluster, admin: Kubectl, namespace: str, chart_account: Path, tmp_path: Path
) -> None:
    """A pod whose Volcano annotations another field manager than Volcano's scheduler wrote is refused by the plugin
    itself: the kubelet's Allocate fails naming the pod and why, and its predicate-time is not taken. Written here by
    kubectl annotate (field manager kubectl-annotate) with the scheduler's account, which the chart's admission
    policy lets write them: a tenant's own forgery never gets that far (test_volcano_admission.py), so this is the
    plugin's check behind the policy, and all there is on a cluster without it (1.29)."""
    chips = bi_v150_chips()
    plugin = start_with_account(
        cluster, tmp_path / "p", "chart-volcano-forged", chart_account, {"flags": {"usevolcano": True}}, []
    )
    try:
        info_name = f"ix-device-info-cm-{cluster.node_name}"
        until(lambda: admin.get_or_none("configmap", info_name, NAMESPACE), 30, info_name, [plugin.process.log])
        notes = {volcano.DEV_VOLCANO: chips[2].uuid, volcano.PREDICATE_TIME: "0"}
        pod = busybox_pod("forged", SHOW_DEVICES + STAY, gpus=1)
        pod["spec"]["schedulerName"] = volcano.SCHEDULER_NAME
        admin.create(pod, "-n", namespace)
        with volcano.volcano_scheduler(cluster, tmp_path / "volcano.kubeconfig") as scheduler:
            volcano.annotate(scheduler, namespace, "forged", notes, field_manager="kubectl-annotate")
            volcano.bind(scheduler, namespace, "forged", cluster.node_name)
        logs = [plugin.process.log]
        failed = wait_pod(admin, namespace, "forged", phase_is("Failed"), "refused at admission", 60, logs)
        assert failed["status"].get("reason") == "UnexpectedAdmissionError", failed["status"]
        message = failed["status"].get("message", "")
        assert f"pod {namespace}/forged" in message and '"kubectl-annotate"' in message, message
        assert failed["metadata"]["annotations"]["predicate-time"] == "0"
        assert f"pod {namespace}/forged's choice of devices is not believed" in plugin.process.log_text()
        # The refusal is an Event on the pod too, written with the chart's grant and allowed by its Events policy.
        selector = f"involvedObject.name=forged,reason={REFUSED_REASON}"
        events = until(
            lambda: admin.items("events", namespace, "--field-selector", selector), 30, "the refusal Event", logs
        )
        (event,) = events
        assert (event["type"], event["involvedObject"]["kind"]) == ("Warning", "Pod"), event
        assert event["source"]["host"] == cluster.node_name and '"kubectl-annotate"' in event["message"], event
        no_refusals(plugin)
    finally:
        admin.delete("pod", "forged", namespace, wait=False)
        plugin.stop()


def test_self_healing_with_the_charts_rbac(
    cluster: Cluster, admin: Kubectl, namespace: str, chart_account: Path, tmp_path: Path
) -> None:
    """A pod holds a board; an XID on its second chip takes the board out (allocatable drops by one) and nothing is
    reset while the pod runs; once it is deleted the chip is reset (a fake ixsmi, through the handshake) and
    allocatable returns; `kubectl describe node` shows each step, and the chart's RBAC allowed every call."""
    ixsmi = fake_ixsmi(tmp_path / "ixsmi")
    chips = bi_v150_chips()
    plugin = start_with_account(
        cluster, tmp_path / "p", "chart-healing", chart_account, {}, ["--ixsmi-path", str(ixsmi)]
    )
    try:
        wait_capacity(cluster, plugin, 2)
        _, output = run_and_read(admin, namespace, busybox_pod("holder", SHOW_DEVICES + STAY, gpus=1))
        held = shown_devices(output)[1]["IX_VISIBLE_DEVICES"].split(",")  # the board's two chips
        broken = next(chip for chip in chips if chip.uuid == held[1])
        plugin.set_chips([replace(chip, xids=(48,)) if chip == broken else chip for chip in chips])
        until(
            lambda: node_resource(admin, cluster.node_name, RESOURCE) == (2, 1),
            60,
            "allocatable 1",
            [plugin.process.log],
        )
        waiting = f"held by {namespace}/holder (main)"
        until(
            lambda: any(waiting in e["message"] for e in node_events(admin, cluster.node_name)),
            30,
            "the chip waits for the pod",
            [plugin.process.log],
        )
        # several looks at pod-resources, each finding the pod still holding the chip
        stays(lambda: ixsmi_calls(ixsmi) == [], 3, "no reset while the pod holds the chip", [plugin.process.log])
        admin.delete("pod", "holder", namespace)
        until(
            lambda: node_resource(admin, cluster.node_name, RESOURCE) == (2, 2),
            60,
            "allocatable back to 2",
            [plugin.process.log],
        )
        assert ixsmi_calls(ixsmi) == [f"-r -i {broken.uuid}"]
        described = admin("describe", "node", cluster.node_name)
        for reason in HEALING_STEPS:
            assert reason in described, described[-3000:]
        assert f"GPU {broken.minor} ({broken.uuid}): XID 48" in described
        healthy = [e for e in node_events(admin, cluster.node_name) if e["reason"] == "GPUHealthy"]
        assert any(broken.uuid in e["message"] and "after a reset" in e["message"] for e in healthy)
        state = yaml.safe_load(
            admin.get("configmap", f"ix-gpu-reset-{cluster.node_name}", NAMESPACE)["data"]["gpuReset"]
        )
        assert state["reset"] is False and state["occupy"]["ix-device-plugin"] is True
        assert 'ix_device_plugin_healing_outcomes_total{outcome="healed"} 1.0' in plugin.metrics()
        no_refusals(plugin)
    finally:
        plugin.stop()


def test_the_chart_grants_node_events_where_a_nodes_events_go(admin: Kubectl, chart_account: Path) -> None:
    account = admin.with_kubeconfig(chart_account)
    assert account.can_i("create", "events", "default") and account.can_i("patch", "events", "default")
    assert account.can_i("watch", "nodes")


@pytest.mark.parametrize(
    ("verb", "resource", "namespace"),
    [
        ("patch", "events", NAMESPACE),  # Volcano mode creates Events anywhere (on pods), patches none
        ("delete", "events", "default"),
        ("update", "events", "default"),
        ("get", "secrets", NAMESPACE),
        ("list", "secrets", None),
        ("update", "nodes", None),  # patch only: the device-access label of its own Node (the admission policy)
        ("create", "nodes", None),
        ("delete", "nodes", None),
        ("delete", "pods", "default"),
        ("create", "configmaps", "default"),
        ("delete", "configmaps", NAMESPACE),
        ("create", "pods", NAMESPACE),
        ("get", "pods", NAMESPACE),  # Volcano mode lists and watches its node's pods, never reads one by name
        ("patch", "configmaps", "default"),
    ],
)
def test_what_the_chart_does_not_grant_is_refused(
    admin: Kubectl, chart_account: Path, verb: str, resource: str, namespace: str | None
) -> None:
    account = admin.with_kubeconfig(chart_account)
    assert not account.can_i(verb, resource, namespace)


def test_a_refused_call_is_refused_by_the_server(admin: Kubectl, chart_account: Path) -> None:
    account = admin.with_kubeconfig(chart_account)
    assert account.can_i("patch", "pods", "default")
    with pytest.raises(KubectlError, match="Forbidden"):
        account("get", "secrets", "-n", NAMESPACE)
    with pytest.raises(KubectlError, match="forbidden"):
        account("create", "configmap", "not-granted", "-n", "default")


def test_the_service_account_token_is_the_only_credential(admin: Kubectl, chart_account: Path) -> None:
    """The plugin runs with nothing but the chart's token: the server sees the ServiceAccount."""
    config = yaml.safe_load(chart_account.read_text())
    assert set(config["users"][0]["user"]) == {"token"}
    review = json.loads(admin.with_kubeconfig(chart_account)("auth", "whoami", "-o", "json"))
    assert review["status"]["userInfo"]["username"] == f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
