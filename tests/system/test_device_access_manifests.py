"""The chart's per-node device access: the agent labels its Node iluvatar.com/gpu.device-access, and the label splits
the GPU nodes between each unprivileged DaemonSet and its privileged fallback; strict mode runs nothing privileged;
the label's grant is bound to the agent's own Node by an admission policy, rendered only where the cluster serves
ValidatingAdmissionPolicy; the kubelet's directories follow the distribution.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml
from helpers.grant_support import grant_table, uncovered
from helpers.manifest_support import (
    STATIC_DIR,
    agent_container,
    by_kind,
    load_file,
    load_render_module,
    needs_helm,
    pod_spec,
    render_failure,
    render_objects,
    schema_errors,
)

from ix_device_plugin.core.deviceaccess import ACCESS_LABEL, ACCESS_VALUES, MISSING_REASON, PRIVILEGED

render = load_render_module()

PLUGIN, DRA = "iluvatar-device-plugin", "iluvatar-dra-driver"
OFF = {"key": ACCESS_LABEL, "operator": "NotIn", "values": [PRIVILEGED]}
ON = {"key": ACCESS_LABEL, "operator": "In", "values": [PRIVILEGED]}
BOTH = {"dra": {"enabled": True}}
STRICT = {"strict": True, "dra": {"enabled": True}}
NO_LABEL = {"features": {"deviceAccessLabel": False}, "dra": {"enabled": True}}
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def daemonsets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {ds["metadata"]["name"]: ds for ds in by_kind(objects, "DaemonSet")}


def agent(ds: dict[str, Any]) -> dict[str, Any]:
    return agent_container(ds)


def env(ds: dict[str, Any]) -> dict[str, str | None]:
    return {item["name"]: item.get("value") for item in agent(ds)["env"]}


def terms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = (spec.get("affinity") or {}).get("nodeAffinity", {})
    return affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])


def matches(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a pod spec's nodeSelector and required node affinity (ANDed) admit a node with these labels."""
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return False

    def holds(expression: dict[str, Any]) -> bool:
        value = labels.get(expression["key"])
        inside = value is not None and value in expression.get("values", [])
        return inside if expression["operator"] == "In" else not inside

    found = terms(spec)
    return not found or any(all(map(holds, term.get("matchExpressions", []))) for term in found)


def policy(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [obj for obj in by_kind(objects, "ValidatingAdmissionPolicy") if obj["metadata"]["name"] == name]
    return found


# ------------------------------------------------------------------ two DaemonSets per agent, split by the label


@pytest.mark.parametrize("injection", ["nri", "runtime"])
def test_by_default_each_agent_has_a_privileged_fallback_with_its_own_selector_and_the_same_account(
    injection: str,
) -> None:
    objects = render_objects({**BOTH, "deviceInjection": injection})
    found = daemonsets(objects)
    assert sorted(found) == [PLUGIN, f"{PLUGIN}-privileged", DRA, f"{DRA}-privileged"]
    for name in (PLUGIN, DRA):
        main, fallback = found[name], found[f"{name}-privileged"]
        assert main["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": name}  # unchanged: immutable
        own = {"app.kubernetes.io/name": f"{name}-privileged"}
        assert fallback["spec"]["selector"]["matchLabels"] == own == fallback["spec"]["template"]["metadata"]["labels"]
        # neither selects the other's pods
        main_pods, fallback_pods = (ds["spec"]["template"]["metadata"]["labels"] for ds in (main, fallback))
        assert not main["spec"]["selector"]["matchLabels"].items() <= fallback_pods.items()
        assert not fallback["spec"]["selector"]["matchLabels"].items() <= main_pods.items()
        assert pod_spec(main)["serviceAccountName"] == pod_spec(fallback)["serviceAccountName"] == name
        assert agent(fallback)["securityContext"] == {
            "privileged": True,
            "readOnlyRootFilesystem": True,
            "runAsUser": 0,
        }
        assert "initContainers" not in pod_spec(fallback)
        assert not any(v["name"] in ("nri", "nri-injector-state") for v in pod_spec(fallback)["volumes"])
        assert agent(main)["securityContext"].get("privileged", False) is False
        for obj in (main, fallback):
            assert schema_errors(obj) == []


@pytest.mark.parametrize("values", [{}, BOTH], ids=["defaults", "with-dra"])
def test_every_node_term_of_the_main_daemonset_keeps_off_privileged_nodes_and_the_fallbacks_only_those(
    values: dict[str, Any],
) -> None:
    found = daemonsets(render_objects(values))
    for name in [n for n in found if not n.endswith("-privileged")]:
        main, fallback = pod_spec(found[name]), pod_spec(found[f"{name}-privileged"])
        assert terms(main) and all(OFF in term["matchExpressions"] for term in terms(main))
        assert terms(fallback) and all(ON in term["matchExpressions"] for term in terms(fallback))
        # the same terms otherwise, and the same nodeSelector (ANDed with them)
        strip = [[e for e in t["matchExpressions"] if e["key"] != ACCESS_LABEL] for t in terms(main)]
        assert strip == [[e for e in t["matchExpressions"] if e["key"] != ACCESS_LABEL] for t in terms(fallback)]
        assert main.get("nodeSelector") == fallback.get("nodeSelector")


@pytest.mark.parametrize("source", ["chart", "static"])
def test_a_gpu_node_runs_exactly_one_agent_whatever_its_label(source: str) -> None:
    if source == "chart":
        objects = render_objects(BOTH)
    else:
        objects = load_file(STATIC_DIR / "ix-device-plugin.yaml") + load_file(STATIC_DIR / "ix-dra-driver.yaml")
    specs = {name: pod_spec(ds) for name, ds in daemonsets(objects).items()}
    for gpu in ({"iluvatar.com/gpu.present": "true"}, {"feature.node.kubernetes.io/pci-1e3e.present": "true"}):
        for dra, driver in (({}, PLUGIN), ({"iluvatar.com/gpu.dra": "true"}, DRA)):
            for value in (None, *ACCESS_VALUES):
                labels = {**gpu, **dra, **({ACCESS_LABEL: value} if value else {})}
                runs = [name for name, spec in specs.items() if matches(spec, labels)]
                expected = f"{driver}-privileged" if value == PRIVILEGED else driver
                assert runs == [expected], labels
    assert not any(matches(spec, {ACCESS_LABEL: PRIVILEGED}) for spec in specs.values())  # not without a GPU


def test_the_split_applies_to_the_affinity_and_node_selector_the_operator_gives() -> None:
    custom_terms = [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": custom_terms}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    values = {"affinity": affinity, "dra": {"enabled": True, "affinity": affinity, "nodeSelector": {"dra": "yes"}}}
    found = daemonsets(render_objects(values))
    for name in (PLUGIN, DRA):
        for suffix, expression in (("", OFF), ("-privileged", ON)):
            spec = pod_spec(found[name + suffix])
            assert [t.get("matchExpressions") for t in terms(spec)] == [
                [*custom_terms[0]["matchExpressions"], expression],
                [expression],
            ]
            assert terms(spec)[1]["matchFields"] == custom_terms[1]["matchFields"]
            assert spec["affinity"]["podAntiAffinity"] == affinity["podAntiAffinity"]
            if name == DRA:  # the operator's selector beside the default one (helm merges maps)
                assert spec["nodeSelector"] == {"iluvatar.com/gpu.dra": "true", "dra": "yes"}
    # the DRA driver's default: its nodeSelector, and a node term carrying the label's expression alone
    default = daemonsets(render_objects(BOTH))
    assert pod_spec(default[DRA])["nodeSelector"] == {"iluvatar.com/gpu.dra": "true"}
    assert terms(pod_spec(default[DRA])) == [{"matchExpressions": [OFF]}]
    assert terms(pod_spec(default[f"{DRA}-privileged"])) == [{"matchExpressions": [ON]}]


@pytest.mark.parametrize(
    "values",
    [STRICT, NO_LABEL, {**BOTH, "privileged": True}, {**BOTH, "deviceInjection": "privileged"}],
    ids=["strict", "no-label", "privileged", "deviceInjection-privileged"],
)
def test_no_fallback_where_there_is_nothing_to_fall_back_from_or_it_is_forbidden(values: dict[str, Any]) -> None:
    objects = render_objects({**values, "metrics": {"enabled": True}})
    found = daemonsets(objects)
    assert sorted(found) == [PLUGIN, DRA]
    for ds in found.values():  # and no label expression: a node labelled privileged before still runs its agent
        assert all(e["key"] != ACCESS_LABEL for t in terms(pod_spec(ds)) for e in t.get("matchExpressions", []))
        assert env(ds)["IX_DEVICE_ACCESS_FALLBACK"] == "none"
    assert sorted(s["metadata"]["name"] for s in by_kind(objects, "Service")) == [f"{PLUGIN}-metrics", f"{DRA}-metrics"]


# ------------------------------------------------------------------ strict


def test_strict_renders_nothing_privileged() -> None:
    for values in (STRICT, {**STRICT, "deviceInjection": "runtime"}):
        for ds in by_kind(render_objects(values), "DaemonSet"):
            spec = pod_spec(ds)
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                assert container["securityContext"].get("privileged", False) is False, ds["metadata"]["name"]
                assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"privileged": True}, "privileged is true"),
        ({"deviceInjection": "privileged"}, "deviceInjection is privileged"),
    ],
)
def test_strict_refuses_privileged_naming_the_conflict(values: dict[str, Any], named: str) -> None:
    error = render_failure({"strict": True, **values})
    assert "strict is true" in error and named in error


def test_strict_leaves_the_label_policy_no_privileged_value() -> None:
    strict = policy(render_objects(STRICT), f"{PLUGIN}-node-label")
    values = {v["name"]: v["expression"] for v in strict["spec"]["variables"]}["labelValues"]
    assert values == str([v for v in ACCESS_VALUES if v != PRIVILEGED]).replace("'", '"')


# ------------------------------------------------------------------ environment


@pytest.mark.parametrize("injection", ["nri", "runtime"])
def test_each_agent_is_told_how_it_gets_the_device_nodes_and_where_a_node_without_goes(injection: str) -> None:
    found = daemonsets(render_objects({**BOTH, "deviceInjection": injection}))
    for name in (PLUGIN, DRA):
        main, fallback = env(found[name]), env(found[f"{name}-privileged"])
        assert (main["IX_DEVICE_ACCESS"], main["IX_DEVICE_ACCESS_FALLBACK"]) == (injection, PRIVILEGED)
        assert (fallback["IX_DEVICE_ACCESS"], fallback["IX_DEVICE_ACCESS_FALLBACK"]) == (PRIVILEGED, PRIVILEGED)
        assert "IX_NRI_STATUS" not in fallback and "IX_DEVICE_ACCESS_LABEL" not in main
        if injection == "nri":
            assert main["IX_NRI_STATUS"] == "/run/ix-nri-injector/status"
            mounts = {m["mountPath"]: m for m in agent(found[name])["volumeMounts"]}
            assert mounts["/run/ix-nri-injector"] == {
                "name": "nri-injector-state",
                "mountPath": "/run/ix-nri-injector",
                "readOnly": True,
            }
        else:
            assert "IX_NRI_STATUS" not in main


@pytest.mark.parametrize(
    ("values", "access", "fallback"),
    [
        (STRICT, "nri", "none"),
        ({**STRICT, "deviceInjection": "runtime"}, "runtime", "none"),
        ({**BOTH, "privileged": True}, PRIVILEGED, "none"),
        ({**BOTH, "deviceInjection": "privileged"}, PRIVILEGED, "none"),
    ],
)
def test_without_a_fallback_the_agent_is_told_so(values: dict[str, Any], access: str, fallback: str) -> None:
    for ds in by_kind(render_objects(values), "DaemonSet"):
        assert (env(ds)["IX_DEVICE_ACCESS"], env(ds)["IX_DEVICE_ACCESS_FALLBACK"]) == (access, fallback)


def test_without_the_label_the_agent_is_told_not_to_write_it() -> None:
    for ds in by_kind(render_objects(NO_LABEL), "DaemonSet"):
        assert env(ds)["IX_DEVICE_ACCESS_LABEL"] == "false"


# ------------------------------------------------------------------ the label's grant and its policy


def test_the_label_adds_node_get_and_patch_and_node_events_bound_by_policies() -> None:
    only_label = {"features": {f: False for f in ("selfHealing", "perNodeConfig", "gpuReset", "volcano")}}
    objects = render_objects(only_label)
    assert grant_table(objects) == {
        ("nodes.core", "get", PLUGIN),  # deviceaccess/service.py: the Node's label read
        ("nodes.core", "patch", PLUGIN),  # and patched
        ("events.core", "create", PLUGIN),  # healing/events.py: the GPUDeviceAccessMissing Node Event
        ("events.core", "patch", PLUGIN),
    }
    assert uncovered(objects) == []
    (events_role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] == f"{PLUGIN}-events"]
    assert events_role["metadata"]["namespace"] == "default"
    events = str(policy(objects, f"{PLUGIN}-events")["spec"]["validations"])
    assert '"Node"' in events and "variables.node" in events
    assert grant_table(render_objects({"features": {**only_label["features"], "deviceAccessLabel": False}})) == set()


@pytest.mark.parametrize("values", [{}, render.DRA_VALUES, BOTH], ids=["plugin", "dra", "both"])
def test_the_label_policy_binds_the_patch_to_the_one_label_of_the_own_node(values: dict[str, Any]) -> None:
    objects = render_objects(values)
    names = [n for n in (PLUGIN, DRA) if n in daemonsets(objects)]
    for name in names:
        spec = policy(objects, f"{name}-node-label")["spec"]
        (rule,) = spec["matchConstraints"]["resourceRules"]
        assert (rule["apiGroups"], rule["resources"]) == ([""], ["nodes"])
        assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"] and rule["apiVersions"] == ["*"]
        assert spec["matchConditions"][0]["expression"].endswith(f'"system:serviceaccount:kube-system:{name}"')
        variables = {v["name"]: v["expression"] for v in spec["variables"]}
        assert variables["labelKey"] == f"'\"{ACCESS_LABEL}\"'".strip("'")
        assert variables["labelValues"] == str(list(ACCESS_VALUES)).replace("'", '"')
        checks = [v["expression"] for v in spec["validations"]]
        assert checks[0] == 'variables.node != ""'  # a token bound to no node writes nothing
        assert checks[1] == 'request.operation == "UPDATE"'  # no create, no delete of Nodes
        assert "object.metadata.name == variables.node" in checks[2]  # its own Node only
        unchanged = checks[3]
        for kept in ("?spec", "?annotations", "?ownerReferences", "?finalizers", "variables.oldLabels.all("):
            assert kept in unchanged, kept  # taints are in the spec
        assert "variables.labelValues" in checks[4]
        bindings = [
            b
            for b in by_kind(objects, "ValidatingAdmissionPolicyBinding")
            if b["spec"]["policyName"] == f"{name}-node-label"
        ]
        assert [b["spec"]["validationActions"] for b in bindings] == [["Deny"]]
    assert uncovered(objects) == []


def test_without_the_label_there_is_no_node_patch_and_no_label_policy() -> None:
    objects = render_objects(NO_LABEL)
    assert not any(grant[0] == "nodes.core" and grant[1] == "patch" for grant in grant_table(objects))
    names = {p["metadata"]["name"] for p in by_kind(objects, "ValidatingAdmissionPolicy")}
    assert not {f"{PLUGIN}-node-label", f"{DRA}-node-label"} & names
    assert uncovered(objects) == []


def test_the_missing_event_the_code_writes_is_what_the_events_policy_allows() -> None:
    """The agent's Node Event (reason MISSING_REASON) is about its own Node: the kind the events policy checks."""
    objects = render_objects({"features": {"selfHealing": False}})
    checks = str(policy(objects, f"{PLUGIN}-events")["spec"]["validations"])
    assert 'o.?kind.orValue("") == "Node"' in checks
    assert MISSING_REASON == "GPUDeviceAccessMissing"


# ------------------------------------------------------------------ admission policies need the API


@pytest.mark.parametrize("values", [{}, BOTH, {"features": {"volcano": True, "gpuReset": True}}])
def test_the_policies_render_only_where_the_cluster_serves_them(values: dict[str, Any]) -> None:
    served = render_objects(values)
    bare = render_objects(values, policies=False)
    assert by_kind(served, "ValidatingAdmissionPolicy") and uncovered(served) == []
    assert not any(obj["kind"] in POLICY_KINDS for obj in bare)
    assert uncovered(bare)  # RBAC alone: the writes are bound by nothing
    # everything else the same: the chart installs with RBAC only
    rest = [obj for obj in served if obj["kind"] not in POLICY_KINDS]
    assert render.differences(rest, bare) == []


def test_the_notes_say_what_is_lost_without_the_policies_and_how_to_get_them() -> None:
    needs_helm()
    notes = render.notes(overrides=BOTH)  # a client-side dry run knows no ValidatingAdmissionPolicy
    assert "ValidatingAdmissionPolicy (Kubernetes 1.30+)" in notes
    assert "any Node's labels" in notes and "ResourceSlices" in notes and "any ConfigMap of kube-system" in notes
    assert "Kubernetes 1.30 or later" in notes
    assert "--api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" in notes


def test_the_notes_say_how_each_node_runs_and_how_to_retry_nri() -> None:
    needs_helm()
    notes = render.notes()
    assert f"kubectl get nodes -L {ACCESS_LABEL}" in notes
    for value in ACCESS_VALUES:
        assert f"\n  {value} " in notes, value
    assert f"kubectl label node <node> {ACCESS_LABEL}-" in notes
    assert f"{PLUGIN}-privileged" in notes
    strict = render.notes(overrides={"strict": True})
    assert "Strict mode" in strict and f"{PLUGIN}-privileged" not in strict
    assert f"\n  {PRIVILEGED} " not in strict


# ------------------------------------------------------------------ Kubernetes version and distributions


def test_the_chart_supports_kubernetes_1_29_and_later() -> None:
    chart = yaml.safe_load((render.CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.29.0-0"  # native sidecars (the NRI injector) on by default
    needs_helm()
    render.helm("template", "r", str(render.CHART_DIR), "--kube-version", "1.29.0")
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render.helm("template", "r", str(render.CHART_DIR), "--kube-version", "1.28.9")
    assert "kubeVersion" in refused.value.stderr


KUBELET_ROOTS = {
    "": "/var/lib/kubelet",
    "microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
    "k0s": "/var/lib/k0s/kubelet",
    "k3s": "/var/lib/kubelet",
    "rke2": "/var/lib/kubelet",
    "openshift": "/var/lib/kubelet",
}


def host_paths(ds: dict[str, Any]) -> set[str]:
    return {v["hostPath"]["path"] for v in pod_spec(ds)["volumes"] if "hostPath" in v}


@pytest.mark.parametrize("distribution", sorted(KUBELET_ROOTS))
def test_the_kubelets_directories_follow_the_distribution(distribution: str) -> None:
    root = KUBELET_ROOTS[distribution]
    found = daemonsets(render_objects({**BOTH, "distribution": distribution}))
    for name in (PLUGIN, f"{PLUGIN}-privileged"):
        paths, variables = host_paths(found[name]), env(found[name])
        # the kubelet serves device plugins' kubelet.sock at this path whatever its root
        assert "/var/lib/kubelet/device-plugins" in paths
        assert variables["IX_DEVICE_PLUGIN_PATH"] == "/var/lib/kubelet/device-plugins"
        assert {f"{root}/plugins/iluvatar.com", f"{root}/pod-resources"} <= paths
        assert variables["KUBELET_PLUGINS_DIRECTORY_PATH"] == f"{root}/plugins"
        assert variables["IX_POD_RESOURCES_SOCKET"] == f"{root}/pod-resources/kubelet.sock"
    for name in (DRA, f"{DRA}-privileged"):
        paths, variables = host_paths(found[name]), env(found[name])
        expected = {f"{root}/plugins_registry", f"{root}/plugins/gpu.iluvatar.com", f"{root}/plugins/iluvatar.com"}
        assert expected | {f"{root}/pod-resources"} <= paths
        assert variables["KUBELET_REGISTRAR_DIRECTORY_PATH"] == f"{root}/plugins_registry"
        assert variables["KUBELET_PLUGINS_DIRECTORY_PATH"] == f"{root}/plugins"
        mounts = {m["mountPath"] for m in agent(found[name])["volumeMounts"]}
        assert expected <= mounts
    kubelet_paths = {p for ds in found.values() for p in host_paths(ds) if "kubelet" in p}
    assert all(p.startswith(root) or p == "/var/lib/kubelet/device-plugins" for p in kubelet_paths)


def test_a_kubelet_root_and_an_explicit_path_win_over_the_distribution() -> None:
    values = {
        **BOTH,
        "distribution": "microk8s",
        "kubeletRoot": "/srv/kubelet",
        "telemetry": {"podResources": {"dir": "/run/pod-resources"}},
        "dra": {"enabled": True, "kubeletRegistrarDirectoryPath": "/srv/registry"},
        "devicePluginPath": "/srv/kubelet/device-plugins",
    }
    found = daemonsets(render_objects(values))
    assert env(found[PLUGIN])["IX_DEVICE_PLUGIN_PATH"] == "/srv/kubelet/device-plugins"
    assert env(found[PLUGIN])["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/srv/kubelet/plugins"
    assert env(found[PLUGIN])["IX_POD_RESOURCES_SOCKET"] == "/run/pod-resources/kubelet.sock"
    assert env(found[DRA])["KUBELET_REGISTRAR_DIRECTORY_PATH"] == "/srv/registry"
    assert env(found[DRA])["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/srv/kubelet/plugins"
    assert "/srv/kubelet/plugins/gpu.iluvatar.com" in host_paths(found[DRA])


def test_an_unknown_distribution_is_refused_naming_the_known_ones() -> None:
    error = render_failure({"distribution": "minikube"})
    assert '"minikube"' in error
    for known in ("microk8s", "k0s", "k3s", "rke2", "openshift"):
        assert known in error
