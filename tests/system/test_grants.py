"""The chart's and the static manifests' API grants: only what the code uses, and every write bound to the node by
an admission policy the API server enforces (its behaviour on a real API server: e2e/tests/test_admission.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from helpers.grant_support import WRITE_OPERATIONS, grant_table, grants, uncovered, write_grants
from helpers.manifest_support import (
    ROOT,
    STATIC_DIR,
    by_kind,
    load_file,
    load_render_module,
    needs_helm,
    render_failure,
    render_objects,
    schema_errors,
)

from ix_device_plugin.apiserver.objects import PodDoc
from ix_device_plugin.deviceplugin.features import volcano
from ix_device_plugin.deviceplugin.features.volcanotrust import REFUSED_REASON, refusal_event
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.gpureset.document import CONFIG_MAP_PREFIX as RESET_PREFIX

render = load_render_module()

FEATURES = ("perNodeConfig", "gpuReset", "volcano", "selfHealing", "deviceAccessLabel")
NONE_ON = dict.fromkeys(FEATURES, False)
RENDERS: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{f"only-{feature}": {"features": {**NONE_ON, feature: True}} for feature in FEATURES},
    "all-features": {"features": dict.fromkeys(FEATURES, True)},
    "dra": render.DRA_VALUES,
    "dra-and-plugin": {"dra": {"enabled": True}, "features": dict.fromkeys(FEATURES, True)},
}
# Each static file with its admission policies (Kubernetes 1.30+).
STATIC_FILES = {
    "ix-device-plugin.yaml": ("ix-device-plugin.yaml", "ix-device-plugin-admission.yaml"),
    "ix-dra-driver.yaml": ("ix-dra-driver.yaml", "ix-dra-driver-admission.yaml"),
}
PLUGIN, DRA = "iluvatar-device-plugin", "iluvatar-dra-driver"


@pytest.fixture(params=[*RENDERS, *STATIC_FILES])
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    if request.param in STATIC_FILES:
        return [obj for name in STATIC_FILES[request.param] for obj in load_file(STATIC_DIR / name)]
    return render_objects(RENDERS[request.param])


def policy(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [obj for obj in by_kind(objects, "ValidatingAdmissionPolicy") if obj["metadata"]["name"] == name]
    return found


def test_every_write_grant_is_bound_to_the_node_by_an_enforced_policy(objects: list[dict[str, Any]]) -> None:
    assert uncovered(objects) == []


def test_the_policies_and_their_bindings_are_valid_api_objects(objects: list[dict[str, Any]]) -> None:
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    assert [error for kind in kinds for obj in by_kind(objects, kind) for error in schema_errors(obj)] == []


def test_the_check_finds_a_write_no_policy_binds() -> None:
    objects = render_objects({"features": dict.fromkeys(FEATURES, True)})
    assert write_grants(objects)
    without = [obj for obj in objects if obj["kind"] != "ValidatingAdmissionPolicyBinding"]
    assert len(uncovered(without)) == sum(len(WRITE_OPERATIONS[grant.verb]) for grant in write_grants(objects))
    for binding in by_kind(objects, "ValidatingAdmissionPolicyBinding"):
        binding["spec"]["validationActions"] = ["Warn"]  # warned, not refused: not enforced
    assert uncovered(objects)


def test_the_check_finds_a_policy_that_lets_a_token_without_a_node_through() -> None:
    objects = render_objects({"features": {**NONE_ON, "gpuReset": True}})
    policy(objects, f"{PLUGIN}-configmaps")["spec"]["validations"].pop(0)
    assert uncovered(objects) == [
        f"create configmaps.core for system:serviceaccount:kube-system:{PLUGIN} "
        f"(Role/kube-system/{PLUGIN}-gpu-reset): CREATE is bound by no policy",
        f"update configmaps.core for system:serviceaccount:kube-system:{PLUGIN} "
        f"(Role/kube-system/{PLUGIN}-gpu-reset): UPDATE is bound by no policy",
    ]


def test_the_plugin_by_default_holds_what_self_healing_the_handshake_and_the_device_access_label_use() -> None:
    assert grant_table(render_objects({})) == {
        ("nodes.core", "get", PLUGIN),  # deviceplugin/handover.py: the Node's kubelet version (auto)
        ("nodes.core", "list", PLUGIN),  # healing/operatorreturn.py: the node annotation iluvatar.com/gpu.return
        ("nodes.core", "watch", PLUGIN),
        ("nodes.core", "patch", PLUGIN),  # the label iluvatar.com/gpu.device-access of its own Node
        ("configmaps.core", "get", PLUGIN),  # gpureset/handshake.py: ix-gpu-reset-<node>
        ("configmaps.core", "create", PLUGIN),
        ("configmaps.core", "update", PLUGIN),
        ("events.core", "create", PLUGIN),  # healing/events.py: Node Events, repeats counted
        ("events.core", "patch", PLUGIN),
    }


def test_volcano_mode_adds_its_pods_and_device_list_and_no_pod_reads_by_name() -> None:
    table = grant_table(render_objects({"features": {**NONE_ON, "volcano": True}}))
    assert table == {
        ("pods.core", "list", PLUGIN),  # the node's pods (spec.nodeName), listed and watched
        ("pods.core", "watch", PLUGIN),
        ("pods.core", "patch", PLUGIN),  # three annotations
        ("configmaps.core", "list", PLUGIN),  # ix-device-info-cm-<node>, followed by name
        ("configmaps.core", "watch", PLUGIN),
        ("configmaps.core", "create", PLUGIN),
        ("configmaps.core", "patch", PLUGIN),
        ("events.core", "create", PLUGIN),  # volcanorefusals.py: a Warning Event on each refused pod
    }


def test_volcano_mode_writes_its_refusal_events_in_every_namespace_bound_by_the_events_policy() -> None:
    """The refused pod may be in any namespace, so the grant is cluster-wide; the policy leaves it only the refusal
    Events the code writes (created, reported by the caller's node) and, with self-healing, Node Events."""
    objects = render_objects({"features": {**NONE_ON, "volcano": True}})
    (events,) = [grant for grant in grants(objects) if grant.resource == "events"]
    assert (events.role, events.verb) == (f"ClusterRole//{PLUGIN}", "create")
    alone = policy(objects, f"{PLUGIN}-events")["spec"]
    assert [check["expression"] for check in alone["validations"][1:]] == ["variables.podRefusal"]
    both = render_objects({"features": {**NONE_ON, "volcano": True, "selfHealing": True}})
    (checked,) = policy(both, f"{PLUGIN}-events")["spec"]["validations"][1:]
    assert '"Node"' in checked["expression"] and checked["expression"].endswith("|| variables.podRefusal")
    assert "podRefusal" not in str(policy(render_objects({}), f"{PLUGIN}-events"))


def test_the_refusal_event_the_code_writes_carries_what_the_policy_checks() -> None:
    """What the policy reads of a refusal Event (type, reason, the Pod, the reporting host) is what the code
    writes; the API server's run of the same policy: e2e/tests/test_admission.py."""
    objects = render_objects({"features": {**NONE_ON, "volcano": True}})
    rules = {v["name"]: v["expression"] for v in policy(objects, f"{PLUGIN}-events")["spec"]["variables"]}
    pod = PodDoc("ml", "p", "uid-p", {}, "Pending", "node-a", None, ())
    event = refusal_event(pod, "node-a", "refused", "p.1", datetime(2026, 1, 2, tzinfo=UTC))
    assert f'object.?type.orValue("") == "{event["type"]}"' in rules["podRefusal"]
    assert f'object.?reason.orValue("") == "{REFUSED_REASON}"' in rules["podRefusal"] and event["reason"] == (
        REFUSED_REASON
    )
    assert f'o.?kind.orValue("") == "{event["involvedObject"]["kind"]}"' in rules["podRefusal"]
    assert 'o.?namespace.orValue("") == request.namespace' in rules["podRefusal"]  # created in the pod's namespace
    assert event["involvedObject"]["namespace"] == pod.namespace
    assert '[object.?source.?host.orValue(""), object.?reportingInstance.orValue("")]' in rules["reporters"]
    assert event["source"]["host"] == event["reportingInstance"] == "node-a"
    assert 'request.operation == "CREATE"' in rules["podRefusal"]


# Volcano mode's guard on the annotations Volcano's scheduler and the plugin write (admission.yaml): every other
# user's create or update of a pod keeps them as they were. Its behaviour on a real API server:
# e2e/tests/test_volcano_admission.py.
VOLCANO_KEYS = f"{PLUGIN}-volcano-keys"
# Volcano's scheduler: the ServiceAccount volcano-scheduler in volcano-system (volcano-sh/volcano,
# installer/volcano-development.yaml), the chart's default volcanoSchedulerUsers.
VOLCANO_SCHEDULER = "system:serviceaccount:volcano-system:volcano-scheduler"
VOLCANO_ONLY = {"features": {**NONE_ON, "volcano": True}}


def cel_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def test_volcano_mode_keeps_the_volcano_keys_to_volcanos_scheduler_and_the_plugin() -> None:
    objects = render_objects(VOLCANO_ONLY)
    spec = policy(objects, VOLCANO_KEYS)["spec"]
    assert spec["failurePolicy"] == "Fail"  # fails closed
    # Creates and updates of pods, at every version; not their subresources (no tenant role writes pods/status or
    # pods/binding, the two that carry annotations); deleting a pod is not checked.
    assert spec["matchConstraints"] == {
        "matchPolicy": "Equivalent",
        "resourceRules": [
            {"apiGroups": [""], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}
        ],
    }
    # Every user but Volcano's scheduler and the plugin's ServiceAccount, whichever namespace or token.
    writers = [VOLCANO_SCHEDULER, f"system:serviceaccount:kube-system:{PLUGIN}"]
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == f"!(request.userInfo.username in {cel_list(writers)})"
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["writers"] == cel_list(writers)  # named in the message
    # The keys the plugin believes and those it writes, as the code names them.
    keys = sorted({volcano.DEV_VOLCANO, volcano.PREDICATE_TIME, volcano.DEV_REAL_ALLOC, volcano.DEV_KUBELET})
    assert variables["keys"] == cel_list(keys)
    assert variables["newAnnotations"] == "object.metadata.?annotations.orValue({})"
    # None before a create (oldObject is null then, and read only on an update).
    assert variables["oldAnnotations"] == (
        'request.operation == "UPDATE" ? oldObject.metadata.?annotations.orValue({}) : {}'
    )
    # A key counts as changed when it is on one side only, or on both with other values.
    changed = variables["changed"]
    assert changed.startswith("variables.keys.filter(k, k in variables.newAnnotations ?")
    assert "!(k in variables.oldAnnotations)" in changed
    assert "variables.oldAnnotations[k] != variables.newAnnotations[k]" in changed
    assert changed.endswith(": k in variables.oldAnnotations)")
    (check,) = spec["validations"]
    assert check["expression"] == "variables.changed.size() == 0" and check["reason"] == "Forbidden"
    assert "variables.changed.join" in check["messageExpression"]
    assert "variables.writers.join" in check["messageExpression"]
    (binding,) = [
        b for b in by_kind(objects, "ValidatingAdmissionPolicyBinding") if b["metadata"]["name"] == VOLCANO_KEYS
    ]
    assert binding["spec"] == {"policyName": VOLCANO_KEYS, "validationActions": ["Deny"]}  # every pod, refused


def test_the_plugins_exemption_is_the_account_its_pods_policy_binds() -> None:
    """The plugin's own writes of the keys pass this policy and are bound by its pods policy instead: its own node's
    pods, three of the keys, nothing else of the pod."""
    objects = render_objects({**VOLCANO_ONLY, "fullnameOverride": "gpu-agent"}, policies=True)
    (bound,) = policy(objects, "gpu-agent-pods")["spec"]["matchConditions"]
    plugin_user = bound["expression"].rpartition(" == ")[2].strip('"')
    assert plugin_user == "system:serviceaccount:kube-system:gpu-agent"
    (condition,) = policy(objects, "gpu-agent-volcano-keys")["spec"]["matchConditions"]
    assert condition["expression"] == f"!(request.userInfo.username in {cel_list([VOLCANO_SCHEDULER, plugin_user])})"


def test_volcanos_scheduler_accounts_are_a_chart_value() -> None:
    accounts = ["system:serviceaccount:vc:vc-scheduler", "system:serviceaccount:vc:vc-scheduler-gpu"]
    objects = render_objects({**VOLCANO_ONLY, "volcanoSchedulerUsers": accounts})
    writers = cel_list([*accounts, f"system:serviceaccount:kube-system:{PLUGIN}"])
    spec = policy(objects, VOLCANO_KEYS)["spec"]
    assert spec["matchConditions"][0]["expression"] == f"!(request.userInfo.username in {writers})"
    assert {v["name"]: v["expression"] for v in spec["variables"]}["writers"] == writers
    alone = policy(render_objects({**VOLCANO_ONLY, "volcanoSchedulerUsers": []}), VOLCANO_KEYS)["spec"]
    plugin_only = cel_list([f"system:serviceaccount:kube-system:{PLUGIN}"])
    assert alone["matchConditions"][0]["expression"] == f"!(request.userInfo.username in {plugin_only})"


def test_volcanos_scheduler_accounts_are_refused_as_anything_but_a_list() -> None:
    failure = render_failure({**VOLCANO_ONLY, "volcanoSchedulerUsers": VOLCANO_SCHEDULER})
    assert f'volcanoSchedulerUsers is "{VOLCANO_SCHEDULER}": a list of user names' in failure


def test_the_volcano_keys_policy_comes_only_with_volcano_mode_and_the_policy_api() -> None:
    def names(objects: list[dict[str, Any]]) -> set[str]:
        kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        return {obj["metadata"]["name"] for kind in kinds for obj in by_kind(objects, kind)}

    assert VOLCANO_KEYS in names(render_objects(VOLCANO_ONLY))
    assert VOLCANO_KEYS in names(render_objects({"dra": {"enabled": True}, "features": dict.fromkeys(FEATURES, True)}))
    for values in ({}, {"features": dict.fromkeys(FEATURES, True) | {"volcano": False}}, render.DRA_VALUES):
        assert VOLCANO_KEYS not in names(render_objects(values))
    assert names(render_objects(VOLCANO_ONLY, policies=False)) == set()  # Kubernetes 1.29: RBAC only
    without = {"dra": {"enabled": True}, "devicePlugin": {"enabled": False}, "features": {"volcano": True}}
    assert VOLCANO_KEYS not in names(render_objects(without))  # Volcano mode is the device plugin's
    assert VOLCANO_KEYS not in str(STATIC_DIR.joinpath("ix-device-plugin-admission.yaml").read_text())


def test_without_the_policy_api_the_notes_say_the_volcano_keys_are_unguarded() -> None:
    needs_helm()
    notes = render.notes(overrides=VOLCANO_ONLY)  # a client-side dry run knows no ValidatingAdmissionPolicy
    assert f"the admission\npolicy {VOLCANO_KEYS} keeps them to Volcano's scheduler" in notes
    assert VOLCANO_KEYS not in render.notes()


def test_the_dra_driver_holds_what_it_uses() -> None:
    assert grant_table(render_objects(render.DRA_VALUES)) == {
        *{("resourceslices.resource.k8s.io", verb, DRA) for verb in ("get", "list", "watch", "create", "update")},
        ("resourceslices.resource.k8s.io", "delete", DRA),
        ("resourceclaims.resource.k8s.io", "get", DRA),
        ("resourceclaims/status.resource.k8s.io", "patch", DRA),
        ("resourceclaims/driver.resource.k8s.io", "associated-node:patch", DRA),
        *{("nodes.core", verb, DRA) for verb in ("get", "list", "watch", "patch")},  # patch: the device-access label
        ("pods.core", "get", DRA),
        *{("configmaps.core", verb, DRA) for verb in ("get", "create", "update")},
        ("events.core", "create", DRA),
        ("events.core", "patch", DRA),
    }


def test_the_policies_name_what_the_code_writes() -> None:
    objects = render_objects({"dra": {"enabled": True}, "features": dict.fromkeys(FEATURES, True)})
    configmaps = str(policy(objects, f"{PLUGIN}-configmaps")["spec"]["validations"])
    assert f'"{RESET_PREFIX}" + variables.node' in configmaps
    assert f'"{volcano.CONFIG_MAP_PREFIX}" + variables.node' in configmaps
    keys = next(v for v in policy(objects, f"{PLUGIN}-pods")["spec"]["variables"] if v["name"] == "volcanoKeys")
    written = {volcano.DEV_KUBELET, volcano.DEV_REAL_ALLOC, volcano.PREDICATE_TIME}
    assert keys["expression"] == str(sorted(written)).replace("'", '"')
    assert f'"{DRIVER}"' in str(policy(objects, f"{DRA}-resourceslices")["spec"]["validations"])
    assert f'"{RESET_PREFIX}" + variables.node' in str(policy(objects, f"{DRA}-configmaps")["spec"]["validations"])


def test_without_api_features_the_plugin_holds_no_grant_and_no_policy() -> None:
    objects = render_objects({"features": NONE_ON})
    assert grants(objects) == [] and by_kind(objects, "ValidatingAdmissionPolicy") == []


# docs/deployment.md's table of grants before the admission policies and now: its mode, each with the values it is
# rendered with, and where a row's grant applies.
TABLE_MODES: dict[str, dict[str, Any]] = {
    "plugin, `selfHealing` and `deviceAccessLabel` (default)": {},
    "plugin, `deviceAccessLabel`": {"features": {**NONE_ON, "deviceAccessLabel": True}},
    "plugin, `perNodeConfig`": {"features": {**NONE_ON, "perNodeConfig": True}},
    "plugin, `gpuReset`": {"features": {**NONE_ON, "gpuReset": True}},
    "plugin, `volcano`": {"features": {**NONE_ON, "volcano": True}},
    "DRA driver": {"dra": {"enabled": True}, "devicePlugin": {"enabled": False}},
}
TABLE_WHERE = {"cluster": "", "every namespace": "", "release namespace": "kube-system", "`default`": "default"}


def documented_grants() -> dict[str, set[tuple[str, str, tuple[str, ...]]]]:
    """Each mode of the table: its rows' (resource, namespace or "" for the cluster, verbs now)."""
    guide = (ROOT / "docs" / "deployment.md").read_text()
    table = guide.split("| Mode (values) | Resource (where) |", 1)[1].split("\n\n", 1)[0]
    found: dict[str, set[tuple[str, str, tuple[str, ...]]]] = {}
    mode = ""
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        mode = cells[0] or mode
        resource, where = cells[1].removesuffix(")").split(" (", 1) if "(" in cells[1] else (cells[1], "")
        verbs = cells[2] if cells[3] == "the same" else cells[3]
        if mode in TABLE_MODES:
            namespace = TABLE_WHERE[where.split(";")[0]]
            found.setdefault(mode, set()).add((resource, namespace, tuple(verbs.split(", "))))
    return found


def test_the_deployment_guides_table_of_grants_now_is_what_the_chart_renders() -> None:
    documented = documented_grants()
    assert sorted(documented) == sorted(TABLE_MODES)
    for mode, values in TABLE_MODES.items():
        rendered: dict[tuple[str, str], list[str]] = {}
        for grant in grants(render_objects(values)):
            kind, namespace, _ = grant.role.split("/")
            rendered.setdefault((grant.resource, namespace if kind == "Role" else ""), []).append(grant.verb)
        assert documented[mode] == {(r, n, tuple(verbs)) for (r, n), verbs in rendered.items()}, mode
