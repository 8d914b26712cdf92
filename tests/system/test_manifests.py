"""The Kubernetes manifests and the Helm chart: valid API objects that agree with each other and the plugin."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.manifest_support import (
    CHART_DIR,
    RESET_PATH_ENV,
    STATIC_DIR,
    agent_container,
    by_kind,
    load_file,
    load_render_module,
    needs_helm,
    only,
    pod_spec,
    render_objects,
    schema_errors,
)

from ix_device_plugin import __version__
from ix_device_plugin.settings.argv import parse_command_line
from ix_device_plugin.settings.configfile import parse_text
from ix_device_plugin.settings.resolve import Resolved, config_from, resolve
from ix_device_plugin.settings.table import DEFAULT_RESOURCE_NAME, RUN, SETTINGS, settings_of

render = load_render_module()

PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
CONFIG_MOUNT = "/ixconfig"
CONFIG_KEY = "ix-config"
HEALTH_PORT = 8080
KNOWN_CONFIG_KEYS = {setting.key for setting in SETTINGS if setting.key} | {
    "resourceName",
    "flags.splitboard",
    "flags.failOnInitError",
    "sharing.timeSlicing.replicas",
    "sharing.timeSlicing.renameByDefault",
    "sharing.timeSlicing.failRequestsGreaterThanOne",
}
NFD_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
METRICS_ON = {"metrics": {"enabled": True, "serviceMonitor": {"enabled": True}}}


def static() -> list[dict[str, Any]]:
    dra = {*render.DRA_STATIC_FILES, "dra-examples.yaml"} - set(render.STATIC_FILES)  # tests/test_dra_manifests.py
    return [obj for path in sorted(STATIC_DIR.glob("*.yaml")) if path.name not in dra for obj in load_file(path)]


def rendered(overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return render_objects(overrides)


PLUGIN = "iluvatar-device-plugin"


def daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The device plugin's DaemonSet (not its privileged fallback)."""
    (found,) = [ds for ds in by_kind(objects, "DaemonSet") if ds["metadata"]["name"] == PLUGIN]
    return found


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return agent_container(daemonset(objects))


def env_of(plugin: dict[str, Any]) -> dict[str, str]:
    """The container's plain env values (those from the downward API are left out)."""
    return {item["name"]: item["value"] for item in plugin.get("env", []) if "value" in item}


def mount_for(objects: list[dict[str, Any]], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volume mount at path and the volume it mounts."""
    (mount,) = [m for m in container(objects)["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in pod_spec(daemonset(objects))["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def port_number(plugin: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in plugin["ports"] if p["name"] == port]
    return number


def config_keys(tree: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        keys |= config_keys(value, path) if isinstance(value, dict) else {path}
    return keys


# Each variant of the manifests that the checks below apply to.
VARIANTS = {
    "static": static,
    "chart-defaults": rendered,
    "chart-metrics": lambda: rendered(METRICS_ON),
}


@pytest.fixture(params=sorted(VARIANTS))
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return VARIANTS[request.param]()


# ------------------------------------------------------------------ schema


def test_every_object_is_a_valid_api_object(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        assert schema_errors(obj) == [], f"{obj['kind']} {obj['metadata'].get('name')}"


def test_the_schema_check_rejects_an_unknown_field() -> None:
    broken = copy.deepcopy(daemonset(static()))
    plugin = pod_spec(broken)["containers"][0]
    plugin["volumeMount"] = plugin.pop("volumeMounts")
    assert any("unknown field 'volumeMount'" in error for error in schema_errors(broken))


def test_the_schema_check_rejects_a_nested_typo_and_a_wrong_type() -> None:
    broken = copy.deepcopy(daemonset(static()))
    plugin = pod_spec(broken)["containers"][0]
    plugin["volumeMounts"][0]["readonly"] = True
    plugin["ports"][0]["containerPort"] = "8080"
    errors = schema_errors(broken)
    assert any("unknown field 'readonly'" in error for error in errors)
    assert any("containerPort: expected int" in error for error in errors)


def test_the_schema_check_rejects_a_missing_required_field() -> None:
    broken = copy.deepcopy(daemonset(static()))
    del pod_spec(broken)["containers"][0]["name"]
    assert schema_errors(broken) != []


def test_the_schema_check_rejects_an_unknown_kind() -> None:
    assert schema_errors({"apiVersion": "apps/v1", "kind": "DaemonSett", "metadata": {"name": "x"}}) != []


# ------------------------------------------------------------------ the DaemonSet and the plugin


def test_the_mounted_configmap_exists(objects: list[dict[str, Any]]) -> None:
    _, volume = mount_for(objects, CONFIG_MOUNT)
    names = {cm["metadata"]["name"] for cm in by_kind(objects, "ConfigMap")}
    assert volume["configMap"]["name"] in names
    (configmap,) = [cm for cm in by_kind(objects, "ConfigMap") if cm["metadata"]["name"] in names]
    assert configmap["metadata"]["namespace"] == daemonset(objects)["metadata"]["namespace"]


def test_the_config_content_has_only_known_keys_and_is_accepted_by_the_plugin(
    objects: list[dict[str, Any]],
) -> None:
    for configmap in by_kind(objects, "ConfigMap"):
        text = configmap["data"][CONFIG_KEY]
        assert config_keys(yaml.safe_load(text)) <= KNOWN_CONFIG_KEYS
        parsed = parse_text(text, configmap["metadata"]["name"])
        assert parsed.warnings == ()
        assert parsed.values == {"flags.splitboard": False}  # sharing off, as the README's defaults
        assert config_from(parsed, {}).replicas == 0
        assert "#     replicas: 4" in text  # the time-slicing example is there, commented


def parse_args(argv: list[str], env: dict[str, str]) -> Resolved:
    """The daemon's settings as the plugin resolves them from argv and env."""
    command = parse_command_line(argv, __version__)
    return resolve(command.mode, command.flags, env)


def test_the_config_is_mounted_where_the_plugin_reads_it(objects: list[dict[str, Any]]) -> None:
    mount, volume = mount_for(objects, CONFIG_MOUNT)
    assert mount.get("readOnly") is True
    assert "configMap" in volume
    args = parse_args([], env_of(container(objects)))
    assert str(args["config"]) == f"{CONFIG_MOUNT}/{CONFIG_KEY}"


def test_every_environment_variable_is_one_the_device_plugin_reads(objects: list[dict[str, Any]]) -> None:
    known = {setting.env for setting in settings_of(RUN)} | {"POD_NAMESPACE"} | RESET_PATH_ENV
    for ds in by_kind(objects, "DaemonSet"):  # the privileged fallback's too
        for name in env_of(agent_container(ds)):
            assert name in known, (ds["metadata"]["name"], name)


def test_the_socket_directory_is_the_kubelets(objects: list[dict[str, Any]]) -> None:
    mount, volume = mount_for(objects, PLUGIN_DIR)
    assert volume["hostPath"]["path"] == PLUGIN_DIR
    assert not mount.get("readOnly", False)
    assert str(parse_args([], env_of(container(objects)))["device_plugin_path"]) == PLUGIN_DIR
    assert str(parse_args([], {})["device_plugin_path"]) == PLUGIN_DIR


def test_the_probes_use_the_plugins_health_endpoints_and_port(objects: list[dict[str, Any]]) -> None:
    plugin = container(objects)
    expected = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in expected.items():
        action = plugin[probe]["httpGet"]
        assert action["path"] == path
        assert port_number(plugin, action["port"]) == HEALTH_PORT
    assert parse_args([], env_of(plugin))["health_address"] == f":{HEALTH_PORT}"
    assert parse_args([], {})["health_address"] == f":{HEALTH_PORT}"


def test_the_host_paths_the_plugin_needs_are_mounted_read_only(objects: list[dict[str, Any]]) -> None:
    for path in ("/dev", "/usr/local/corex"):  # /sys: the container's own read-only sysfs (docs/deployment.md)
        mount, volume = mount_for(objects, path)
        assert mount.get("readOnly") is True, path
        assert volume["hostPath"]["path"] == path


def test_every_volume_is_mounted_and_every_mount_has_a_volume(objects: list[dict[str, Any]]) -> None:
    for ds in by_kind(objects, "DaemonSet"):
        spec = pod_spec(ds)
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        mounted = {m["name"] for c in containers for m in c["volumeMounts"]}
        volumes = {v["name"] for v in spec["volumes"]}
        assert mounted == volumes, ds["metadata"]["name"]


def test_the_image_tag_is_the_package_version(objects: list[dict[str, Any]]) -> None:
    assert container(objects)["image"] == f"ix-device-plugin:{__version__}"


def test_the_chart_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["version"] == __version__
    assert chart["appVersion"] == __version__


def test_the_daemonset_keeps_the_seed_names(objects: list[dict[str, Any]]) -> None:
    ds = daemonset(objects)
    labels = {"app.kubernetes.io/name": "iluvatar-device-plugin"}
    assert ds["metadata"]["name"] == "iluvatar-device-plugin"
    assert ds["metadata"]["namespace"] == "kube-system"
    assert ds["spec"]["selector"]["matchLabels"] == labels
    assert ds["spec"]["template"]["metadata"]["labels"] == labels
    assert pod_spec(ds)["priorityClassName"] == "system-node-critical"


def test_the_security_context_is_coherent(objects: list[dict[str, Any]]) -> None:
    spec = pod_spec(daemonset(objects))
    assert spec.get("securityContext", {}) is not None
    context = container(objects)["securityContext"]
    if context.get("privileged"):
        # Privileged grants every capability; a drop list beside it would only mislead.
        assert "capabilities" not in context
        assert context.get("allowPrivilegeEscalation", True) is True


def test_resources_are_requested_and_memory_is_limited(objects: list[dict[str, Any]]) -> None:
    resources = container(objects)["resources"]
    assert resources["requests"] == {"cpu": "10m", "memory": "64Mi"}
    assert resources["limits"] == {"memory": "256Mi"}


def test_it_tolerates_gpu_taints_and_stays_on_gpu_nodes(objects: list[dict[str, Any]]) -> None:
    spec = pod_spec(daemonset(objects))
    tolerated = {(t["key"], t["operator"], t.get("effect")) for t in spec["tolerations"]}
    assert ("iluvatar.com/gpu", "Exists", "NoSchedule") in tolerated
    assert ("CriticalAddonsOnly", "Exists", None) in tolerated
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {expr["key"] for term in terms for expr in term["matchExpressions"] if expr["operator"] == "In"}
    assert keys == {"iluvatar.com/gpu.present", "feature.node.kubernetes.io/pci-1e3e.present"}
    for term in terms:  # and never where the DRA driver serves iluvatar.com/gpu
        assert {"key": "iluvatar.com/gpu.dra", "operator": "NotIn", "values": ["true"]} in term["matchExpressions"]


def test_the_example_pod_requests_one_gpu() -> None:
    pod = only(load_file(STATIC_DIR / "corex-example.yaml"), "Pod")
    assert pod["metadata"]["name"] == "corex-example"
    (example,) = pod["spec"]["containers"]
    assert example["resources"]["limits"] == {DEFAULT_RESOURCE_NAME: 1}


# ------------------------------------------------------------------ the chart


def test_the_chart_with_default_values_renders_the_static_manifests() -> None:
    assert render.differences(rendered(), render.static_objects(STATIC_DIR)) == []


def test_without_admission_policies_the_chart_renders_the_static_manifests_but_the_admission_file() -> None:
    """A cluster that serves no ValidatingAdmissionPolicy (1.29) gets ix-device-plugin.yaml; 1.30+ adds
    ix-device-plugin-admission.yaml, which holds the policies and nothing else."""
    bare = render_objects(None, policies=False)
    assert render.differences(bare, render.static_objects(STATIC_DIR, policies=False)) == []
    admission = load_file(STATIC_DIR / "ix-device-plugin-admission.yaml")
    assert {obj["kind"] for obj in admission} == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert not any(obj["kind"].startswith("ValidatingAdmissionPolicy") for obj in bare)


def test_the_static_files_reproduced_by_the_chart_are_all_there_is_besides_the_example() -> None:
    names = {path.name for path in STATIC_DIR.glob("*.yaml")}
    assert names == {*render.STATIC_FILES, *render.DRA_STATIC_FILES, *render.EXAMPLE_FILES}


def test_metrics_add_a_service_and_a_service_monitor_that_find_the_plugin() -> None:
    """A Service per DaemonSet (the plugin's and its privileged fallback's), each selecting its pods, all found by
    the one ServiceMonitor."""
    objects = rendered(METRICS_ON)
    monitor = only(objects, "ServiceMonitor")
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    assert sorted(services) == [f"{PLUGIN}-metrics", f"{PLUGIN}-privileged-metrics"]
    for ds in by_kind(objects, "DaemonSet"):
        service = services[f"{ds['metadata']['name']}-metrics"]
        (port,) = service["spec"]["ports"]
        assert port_number(agent_container(ds), port["targetPort"]) == HEALTH_PORT
        assert service["spec"]["selector"] == ds["spec"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert monitor["spec"]["endpoints"][0]["port"] == port["name"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


PROMETHEUS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


@pytest.mark.parametrize("dra", [False, True])
def test_the_network_policy_lets_only_the_health_port_in_and_only_from_the_named_peers(dra: bool) -> None:
    """Off by default; on, it selects the pods of every DaemonSet (the fallbacks too) and lets in healthPort alone,
    from metricsFrom alone; without peers, nothing."""
    modes = {"dra": {"enabled": dra}}
    assert by_kind(rendered(modes), "NetworkPolicy") == []
    objects = rendered({**modes, "networkPolicy": {"enabled": True, "metricsFrom": PROMETHEUS}})
    policy = only(objects, "NetworkPolicy")
    (selector,) = policy["spec"]["podSelector"]["matchExpressions"]
    daemonsets = by_kind(objects, "DaemonSet")
    pods = {ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] for ds in daemonsets}
    assert selector["key"] == "app.kubernetes.io/name" and selector["operator"] == "In"
    assert set(selector["values"]) == pods and len(pods) == (4 if dra else 2)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == PROMETHEUS and rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    for ds in daemonsets:
        assert port_number(agent_container(ds), "http") == HEALTH_PORT
    closed = only(rendered({**modes, "networkPolicy": {"enabled": True}}), "NetworkPolicy")
    assert closed["spec"]["ingress"] == []


def test_the_service_monitor_needs_metrics_enabled() -> None:
    objects = rendered({"metrics": {"serviceMonitor": {"enabled": True}}})
    assert by_kind(objects, "ServiceMonitor") == [] and by_kind(objects, "Service") == []


def test_an_existing_configmap_is_mounted_instead_of_a_new_one() -> None:
    objects = rendered({"config": {"create": False, "name": "site-ix-config"}})
    assert by_kind(objects, "ConfigMap") == []
    _, volume = mount_for(objects, CONFIG_MOUNT)
    assert volume["configMap"]["name"] == "site-ix-config"


def test_values_reach_the_rendered_objects() -> None:
    overrides = {
        "image": {"repository": "registry.example/ix-device-plugin", "tag": "9.9.9"},
        "config": {"content": "sharing:\n  timeSlicing:\n    replicas: 2\n"},  # text: helm's nindent wants a string
        "healthPort": 9090,
        "extraEnv": [{"name": "IX_LOG_FORMAT", "value": "json"}],
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
    }
    objects = rendered(overrides)
    for obj in objects:
        assert schema_errors(obj) == []
    plugin = container(objects)
    assert plugin["image"] == "registry.example/ix-device-plugin:9.9.9"
    assert yaml.safe_load(only(objects, "ConfigMap")["data"][CONFIG_KEY])["sharing"]["timeSlicing"]["replicas"] == 2
    assert port_number(plugin, plugin["livenessProbe"]["httpGet"]["port"]) == 9090
    assert parse_args([], env_of(plugin))["health_address"] == ":9090"
    assert env_of(plugin)["IX_LOG_FORMAT"] == "json"
    assert pod_spec(daemonset(objects))["nodeSelector"] == {"kubernetes.io/arch": "amd64"}


# ------------------------------------------------------------------ make manifests and the chart's notes


def test_the_make_manifests_check_passes() -> None:
    needs_helm()
    assert render.main(["check"]) == 0


def test_the_chart_has_notes_that_say_how_to_check_it() -> None:
    needs_helm()
    rendered = render.notes()
    assert "kubectl -n kube-system get ds iluvatar-device-plugin" in rendered
    assert "logs ds/iluvatar-device-plugin" in rendered
    assert "ConfigMap ix-config" in rendered


def test_the_corex_directory_never_blocks_the_pod_from_starting(objects: list[dict[str, Any]]) -> None:
    _, volume = mount_for(objects, "/usr/local/corex")
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"  # the plugin then says what is missing


NO_API = {"selfHealing": False, "deviceAccessLabel": False}  # every API feature off: the defaults turn these on


def test_without_api_features_no_token_is_mounted_and_no_rbac_rendered() -> None:
    objects = rendered({"features": NO_API})
    assert pod_spec(daemonset(objects))["automountServiceAccountToken"] is False
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "Role")
    assert env_of(container(objects))["IX_SELF_HEALING"] == "false"  # the chart grants it nothing: it stays off
    assert env_of(container(objects))["IX_DEVICE_ACCESS_LABEL"] == "false"  # nor the node label


def test_self_healing_adds_node_reads_the_handshake_and_events_where_a_nodes_go(objects: list[dict[str, Any]]) -> None:
    """Self-healing and the device-access label (both on by default): node reads, the label's patch, the handshake
    and Node Events."""
    for ds in by_kind(objects, "DaemonSet"):  # the privileged fallback runs as the same ServiceAccount
        spec = pod_spec(ds)
        assert spec["serviceAccountName"] == "iluvatar-device-plugin"
        # Its token reaches the agent's container alone (test_least_privilege.py), not by the pod's automount.
        assert spec["automountServiceAccountToken"] is False
    assert "IX_SELF_HEALING" not in env_of(container(objects))  # auto: on, with the handshake
    assert "IX_DEVICE_ACCESS_LABEL" not in env_of(container(objects))  # on: it labels its Node
    (cluster_role,) = by_kind(objects, "ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
    ]
    roles = {
        (role["metadata"]["namespace"], role["metadata"]["name"]): role["rules"] for role in by_kind(objects, "Role")
    }
    assert roles == {
        ("kube-system", "iluvatar-device-plugin-gpu-reset"): [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update"]}
        ],
        ("default", "iluvatar-device-plugin-events"): [
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}
        ],
    }
    bindings = {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in by_kind(objects, "RoleBinding")}
    assert bindings == set(roles)


def test_per_node_config_adds_a_service_account_and_only_node_reads() -> None:
    objects = rendered({"features": {**NO_API, "perNodeConfig": True}})
    spec = pod_spec(daemonset(objects))
    assert spec["serviceAccountName"] == "iluvatar-device-plugin"
    (role,) = by_kind(objects, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert env_of(container(objects))["IX_PER_NODE_CONFIG"] == "true"
    assert not by_kind(objects, "Role")


def test_volcano_adds_pod_lists_watches_and_patches_and_its_watched_configmap() -> None:
    objects = rendered({"features": {**NO_API, "volcano": True}})
    (cluster_role,) = by_kind(objects, "ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},  # a refusal Event on the pod
    ]
    (role,) = by_kind(objects, "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch", "create", "patch"]}
    ]


def test_gpu_reset_adds_only_configmap_access_in_the_plugins_namespace() -> None:
    objects = rendered({"features": {**NO_API, "gpuReset": True}})
    assert pod_spec(daemonset(objects))["serviceAccountName"] == "iluvatar-device-plugin"
    assert not by_kind(objects, "ClusterRole")
    (role,) = by_kind(objects, "Role")
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update"]}]
    (binding,) = by_kind(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_the_node_files_are_written_where_runtimes_and_nfd_read_them(objects: list[dict[str, Any]]) -> None:
    env = env_of(container(objects))
    for variable, path in (("IX_CDI_SPEC_DIR", "/var/run/cdi"), ("IX_NODE_FEATURE_DIR", NFD_DIR)):
        assert env[variable] == path
        mount, volume = mount_for(objects, path)
        assert volume["hostPath"]["path"] == path and not mount.get("readOnly", False)


def test_the_node_files_can_be_turned_off() -> None:
    objects = rendered({"cdi": {"enabled": False}, "nodeFeatures": {"enabled": False}})
    env = env_of(container(objects))
    assert (env["IX_CDI_SPEC_DIR"], env["IX_NODE_FEATURE_DIR"]) == ("off", "off")


def test_the_example_pod_tolerates_the_gpu_taint_the_daemonset_tolerates(objects: list[dict[str, Any]]) -> None:
    pod = only(load_file(STATIC_DIR / "corex-example.yaml"), "Pod")
    taints = {(t["key"], t.get("effect")) for t in pod["spec"]["tolerations"]}
    assert ("iluvatar.com/gpu", "NoSchedule") in taints


TROUBLESHOOTING_LINES = (
    "is the CoreX driver stack installed and /usr/local/corex",
    "no GPUs could be discovered; exiting (set flags.failOnInitError: false",
    "does not exist (is the kubelet's ",
    "another plugin is already serving on ",
    "config change rejected, keeping the last good configuration",
    "waiting for the kubelet to serve",
    "; retrying with backoff up to",
    "became Unhealthy",
    "chip missing from enumeration",
    "did not return within",
    "self-healing is off (",
    "GPUHealingWaiting",
    "iluvatar.com/gpu.return",
)


def test_the_troubleshooting_guide_quotes_log_lines_the_plugin_really_writes() -> None:
    guide = (Path(CHART_DIR).parent.parent.parent / "docs" / "deployment.md").read_text()
    troubleshooting = guide[guide.index("## Troubleshooting") :]
    source = "\n".join(path.read_text() for path in Path(CHART_DIR).parent.parent.parent.glob("src/**/*.py"))
    for fragment in TROUBLESHOOTING_LINES:
        assert fragment in troubleshooting, fragment
        assert fragment in source.replace('"\n                    "', "").replace('"\n                "', ""), fragment
    assert troubleshooting.count("\n| ") >= 7  # a header, its rule and at least five failures


def test_the_daemonset_rolls_with_a_surge_and_each_pod_serves_its_own_socket(objects: list[dict[str, Any]]) -> None:
    """maxSurge 1, maxUnavailable 0: the new pod starts beside the old one; POD_UID names its socket and
    ZERO_DOWNTIME_UPGRADE says whether it registers beside the old one."""
    assert daemonset(objects)["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    plugin = container(objects)
    (uid,) = [item for item in plugin["env"] if item["name"] == "POD_UID"]
    assert uid["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert parse_args([], {**env_of(plugin), "POD_UID": "3f1c"})["pod_uid"] == "3f1c"
    assert parse_args([], env_of(plugin))["zero_downtime_upgrade"] == "auto"


def test_zero_downtime_upgrade_is_a_chart_value() -> None:
    plugin = container(rendered({"zeroDowntimeUpgrade": "false"}))
    assert parse_args([], env_of(plugin))["zero_downtime_upgrade"] == "false"


def test_volcano_modes_scheduler_field_manager_is_a_chart_value() -> None:
    """With features.volcano the plugin is told whose Volcano annotations to believe (default Volcano's scheduler)."""
    assert parse_args([], env_of(container(rendered({"features": {"volcano": True}}))))["volcano_field_manager"] == (
        "vc-scheduler"
    )
    custom = rendered({"features": {"volcano": True}, "volcanoFieldManager": "my-scheduler"})
    assert parse_args([], env_of(container(custom)))["volcano_field_manager"] == "my-scheduler"
