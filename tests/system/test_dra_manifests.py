"""The DRA manifests: the chart with dra.enabled renders deployments/static/ix-dra-driver.yaml; objects are valid."""

from __future__ import annotations

from typing import Any

import helpers.manifest_support as manifest_support
import pytest
from helpers.manifest_support import (
    RESET_PATH_ENV,
    STATIC_DIR,
    agent_container,
    by_kind,
    load_file,
    load_render_module,
    only,
    pod_spec,
    render_objects,
    schema_errors,
)

from ix_device_plugin import __version__
from ix_device_plugin.dra import pool
from ix_device_plugin.dra.config import GpuConfig, decode
from ix_device_plugin.dra.registration import REGISTRATION_SOCKET, plugin_dir
from ix_device_plugin.healing.record import record_path
from ix_device_plugin.settings.argv import parse_command_line
from ix_device_plugin.settings.resolve import resolve
from ix_device_plugin.settings.table import DRA, settings_of

render = load_render_module()


DRIVER_DS = "iluvatar-dra-driver"


def rendered(overrides: dict[str, Any]) -> list[dict[str, Any]]:
    return render_objects(overrides)


def driver_daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The DRA driver's DaemonSet (not its privileged fallback, iluvatar-dra-driver-privileged)."""
    (found,) = [d for d in by_kind(objects, "DaemonSet") if d["metadata"]["name"] == DRIVER_DS]
    return found


def test_the_chart_in_dra_mode_renders_the_static_dra_manifest() -> None:
    assert render.differences(rendered(render.DRA_VALUES), render.dra_objects(STATIC_DIR)) == []


def test_dra_objects_only_when_enabled_and_the_plugin_can_be_switched_off() -> None:
    defaults = rendered({})
    assert by_kind(defaults, "DeviceClass") == []
    # each with its privileged fallback (for the nodes labelled iluvatar.com/gpu.device-access=privileged)
    assert [d["metadata"]["name"] for d in by_kind(defaults, "DaemonSet")] == [
        "iluvatar-device-plugin",
        "iluvatar-device-plugin-privileged",
    ]
    both = rendered({"dra": {"enabled": True}})
    assert sorted(d["metadata"]["name"] for d in by_kind(both, "DaemonSet")) == [
        "iluvatar-device-plugin",
        "iluvatar-device-plugin-privileged",
        "iluvatar-dra-driver",
        "iluvatar-dra-driver-privileged",
    ]
    selectors = [tuple(d["spec"]["selector"]["matchLabels"].items()) for d in by_kind(both, "DaemonSet")]
    assert len(set(selectors)) == len(selectors)  # the DaemonSets never adopt each other's pods
    dra_only = rendered(render.DRA_VALUES)
    assert [d["metadata"]["name"] for d in by_kind(dra_only, "DaemonSet")] == [DRIVER_DS, f"{DRIVER_DS}-privileged"]
    (config,) = by_kind(dra_only, "ConfigMap")  # the driver reads flags.splitboard and replicas from it
    for daemonset in by_kind(dra_only, "DaemonSet"):
        volumes = pod_spec(daemonset)["volumes"]
        assert {"name": "config", "configMap": {"name": config["metadata"]["name"]}} in volumes


def matches(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a pod spec's nodeSelector and required node affinity admit a node with these labels."""
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return False
    affinity = (
        (spec.get("affinity") or {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if affinity is None:
        return True

    def holds(expression: dict[str, Any]) -> bool:
        value = labels.get(expression["key"])
        inside = value is not None and value in expression.get("values", [])
        return inside if expression["operator"] == "In" else not inside

    return any(all(map(holds, term.get("matchExpressions", []))) for term in affinity["nodeSelectorTerms"])


@pytest.mark.parametrize("source", ["chart", "static"])
def test_a_node_runs_the_device_plugin_or_the_dra_driver_never_both(source: str) -> None:
    if source == "chart":
        objects = rendered({"dra": {"enabled": True}})
    else:
        objects = load_file(STATIC_DIR / "ix-device-plugin.yaml") + load_file(STATIC_DIR / "ix-dra-driver.yaml")
    specs = {d["metadata"]["name"]: pod_spec(d) for d in by_kind(objects, "DaemonSet")}
    gpu = {"feature.node.kubernetes.io/pci-1e3e.present": "true"}
    for labels, runs in [
        (gpu, "iluvatar-device-plugin"),
        ({**gpu, "iluvatar.com/gpu.dra": "true"}, "iluvatar-dra-driver"),
        ({**gpu, "iluvatar.com/gpu.dra": "false"}, "iluvatar-device-plugin"),
        ({"iluvatar.com/gpu.present": "true"}, "iluvatar-device-plugin"),
    ]:
        assert [name for name, spec in specs.items() if matches(spec, labels)] == [runs], labels
    assert not any(matches(spec, {}) for spec in specs.values())  # nodes without GPUs run neither


@pytest.mark.parametrize("name", ["ix-dra-driver.yaml", "dra-examples.yaml"])
def test_every_dra_object_is_a_valid_api_object(name: str) -> None:
    for obj in load_file(STATIC_DIR / name):
        assert checked(obj) == [], f"{obj['kind']} {obj['metadata']['name']}"


def checked(obj: dict[str, Any]) -> list[str]:
    """schema_errors, also for ResourceClaim, whose client model is named ResourceV1ResourceClaim."""
    if obj.get("apiVersion") != "resource.k8s.io/v1" or obj.get("kind") != "ResourceClaim":
        return schema_errors(obj)
    errors: list[str] = []
    normalised = manifest_support._walk(obj, "ResourceV1ResourceClaim", "ResourceClaim", errors)
    return errors or manifest_support._construct("ResourceV1ResourceClaim", normalised)


def test_the_device_classes_select_chips_whole_boards_and_shares_and_can_name_the_extended_resource() -> None:
    classes = {
        c["metadata"]["name"]: c["spec"] for c in by_kind(load_file(STATIC_DIR / "ix-dra-driver.yaml"), "DeviceClass")
    }
    assert sorted(classes) == ["board.gpu.iluvatar.com", "gpu.iluvatar.com", "share.gpu.iluvatar.com"]
    chips = classes["gpu.iluvatar.com"]["selectors"][0]["cel"]["expression"]
    assert chips == (
        'device.driver == "gpu.iluvatar.com" && device.attributes["gpu.iluvatar.com"].?type.orValue("chip") == "chip"'
    )
    boards = classes["board.gpu.iluvatar.com"]["selectors"][0]["cel"]["expression"]
    assert boards.endswith('device.attributes["gpu.iluvatar.com"].?wholeBoard.orValue(false)')
    shares = classes["share.gpu.iluvatar.com"]["selectors"][0]["cel"]["expression"]
    assert shares.endswith('device.attributes["gpu.iluvatar.com"].?shared.orValue(false)')
    assert all("extendedResourceName" not in spec for spec in classes.values())
    values = {**render.DRA_VALUES, "dra": {"enabled": True, "extendedResourceName": "iluvatar.com/gpu"}}
    extended = {c["metadata"]["name"]: c["spec"] for c in by_kind(rendered(values), "DeviceClass")}
    unit = extended["extended-resource.gpu.iluvatar.com"]
    assert unit["extendedResourceName"] == "iluvatar.com/gpu"
    assert unit["selectors"][0]["cel"]["expression"].endswith(".?extendedResource.orValue(true)")
    assert extended["gpu.iluvatar.com"] == classes["gpu.iluvatar.com"]  # the chip class keeps its meaning


def test_the_rbac_is_the_narrowest() -> None:
    objects = load_file(STATIC_DIR / "ix-dra-driver.yaml")
    role = only(objects, "ClusterRole")
    rules = {
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames", ()))): set(r["verbs"])
        for r in role["rules"]
    }
    assert rules == {
        (("resource.k8s.io",), ("resourceslices",), ()): {"get", "list", "watch", "create", "update", "delete"},
        (("resource.k8s.io",), ("resourceclaims",), ()): {"get"},
        (("resource.k8s.io",), ("resourceclaims/status",), ()): {"patch"},
        (("resource.k8s.io",), ("resourceclaims/driver",), ("gpu.iluvatar.com",)): {"associated-node:patch"},
        # its own Node: its UID, iluvatar.com/gpu.return; patch: its label iluvatar.com/gpu.device-access
        (("",), ("nodes",), ()): {"get", "list", "watch", "patch"},
        (("",), ("pods",), ()): {"get"},  # which container holds which claim: every chip named (docs/dra.md)
    }
    roles = {role["metadata"]["name"]: role for role in by_kind(objects, "Role")}
    handshake = roles["iluvatar-dra-driver-gpu-reset"]  # ConfigMaps in its own namespace only, for the handshake
    assert handshake["metadata"]["namespace"] == driver_daemonset(objects)["metadata"]["namespace"]
    assert handshake["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update"]}
    ]
    events = roles["iluvatar-dra-driver-events"]  # Node Events, where the API server takes a Node's
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]
    assert len(roles) == 2
    account = only(objects, "ServiceAccount")["metadata"]["name"]
    bindings = by_kind(objects, "RoleBinding")
    assert {b["roleRef"]["name"] for b in bindings} == set(roles)
    assert all(b["subjects"][0]["name"] == account for b in bindings)


def test_the_daemonset_runs_dra_mode_with_the_kubelets_directories_mounted() -> None:
    objects = load_file(STATIC_DIR / "ix-dra-driver.yaml")
    spec = pod_spec(driver_daemonset(objects))
    container = agent_container(driver_daemonset(objects))
    assert container["args"] == ["dra"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    known = {setting.env for setting in settings_of(DRA)} | {"POD_NAMESPACE"} | RESET_PATH_ENV
    assert set(env) <= known  # only settings the DRA mode uses
    command = parse_command_line(container["args"], __version__)
    settings = resolve(command.mode, command.flags, {k: v for k, v in env.items() if v is not None})
    assert (command.mode, settings.unused_env) == (DRA, ())
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    plugins = settings["kubelet_plugins_directory_path"]
    assert {
        str(settings["kubelet_registrar_directory_path"]),
        str(plugin_dir(plugins)),  # the driver's own directory, not the kubelet's whole plugins directory
        str(record_path(plugins).parent),
        str(settings["cdi_spec_dir"]),
    } <= mounts
    assert str(plugins) not in mounts
    assert REGISTRATION_SOCKET == "gpu.iluvatar.com-reg.sock"
    pod_uid = next(item for item in container["env"] if item["name"] == "POD_UID")
    assert pod_uid["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"  # sockets named per pod
    strategy = driver_daemonset(objects)["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert spec["serviceAccountName"] == only(objects, "ServiceAccount")["metadata"]["name"]


def test_the_examples_ask_for_one_chip_a_whole_board_and_a_shared_claim() -> None:
    objects = load_file(STATIC_DIR / "dra-examples.yaml")
    templates = {t["metadata"]["name"]: t["spec"]["spec"]["devices"] for t in by_kind(objects, "ResourceClaimTemplate")}
    assert templates["whole-iluvatar-board"]["constraints"] == [
        {"requests": ["chips"], "matchAttribute": "gpu.iluvatar.com/boardUUID"}
    ]
    assert templates["whole-iluvatar-board"]["requests"][0]["exactly"]["count"] == 2
    claimed = [p for p in by_kind(objects, "Pod") if p["spec"].get("resourceClaims")]
    shared = [p for p in claimed if p["spec"]["resourceClaims"][0].get("resourceClaimName")]
    assert {p["spec"]["resourceClaims"][0]["resourceClaimName"] for p in shared} == {"shared-iluvatar-gpu"}
    assert len(shared) == 2
    board = templates["one-iluvatar-board"]["requests"][0]["exactly"]
    assert board["deviceClassName"] == "board.gpu.iluvatar.com"
    assert templates["two-iluvatar-shares"]["requests"][0]["exactly"]["capacity"] == {"requests": {"shares": "2"}}
    (config,) = templates["fresh-iluvatar-gpu"]["config"]
    gpu_config = config["opaque"]["parameters"]
    assert config["opaque"]["driver"] == "gpu.iluvatar.com" and gpu_config["reset"] is True
    assert decode(gpu_config, "example") == GpuConfig(reset=True)  # what the driver reads from it
    extended = only([p for p in by_kind(objects, "Pod") if not p["spec"].get("resourceClaims")], "Pod")
    assert extended["spec"]["containers"][0]["resources"]["limits"] == {"iluvatar.com/gpu": 2}


def _env_and_mounts(daemonset: dict[str, Any]) -> tuple[dict[str, str | None], dict[str, dict[str, Any]]]:
    container = agent_container(daemonset)
    env = {item["name"]: item.get("value") for item in container["env"]}
    return env, {mount["mountPath"]: mount for mount in container["volumeMounts"]}


def test_the_dra_daemonset_mounts_what_the_node_services_need_and_shares_the_plugins_feature_file() -> None:
    """Node labels (NFD's features.d, written) and who holds each chip (the pod-resources socket, read-only), the
    same feature directory as the device plugin's: a node moved between the two keeps one file."""
    objects = rendered({"dra": {"enabled": True}})
    daemonsets = by_kind(objects, "DaemonSet")
    driver = driver_daemonset(objects)
    assert agent_container(driver).get("args") == ["dra"]
    (plugin,) = [d for d in daemonsets if d["metadata"]["name"] == "iluvatar-device-plugin"]
    env, mounts = _env_and_mounts(driver)
    assert env["IX_NODE_FEATURE_DIR"] in mounts and not mounts[env["IX_NODE_FEATURE_DIR"]].get("readOnly")
    socket = str(env["IX_POD_RESOURCES_SOCKET"])
    assert socket.endswith("/kubelet.sock") and mounts[socket.rsplit("/", 1)[0]]["readOnly"] is True
    assert env["IX_TELEMETRY_INTERVAL"] == "15"
    plugin_env, _ = _env_and_mounts(plugin)
    for name in ("IX_NODE_FEATURE_DIR", "IX_POD_RESOURCES_SOCKET", "IX_TELEMETRY_INTERVAL"):
        assert env[name] == plugin_env[name], name


def test_the_node_services_of_the_dra_driver_can_be_turned_off_as_the_plugins() -> None:
    objects = rendered({**render.DRA_VALUES, "nodeFeatures": {"enabled": False}, "telemetry": {"enabled": False}})
    env, mounts = _env_and_mounts(driver_daemonset(objects))
    assert env["IX_NODE_FEATURE_DIR"] == env["IX_TELEMETRY_INTERVAL"] == "off"
    assert not any("node-feature-discovery" in path or "pod-resources" in path for path in mounts)


def test_metrics_of_both_front_ends_are_one_job_with_the_node_as_instance() -> None:
    objects = rendered({"dra": {"enabled": True}, "metrics": {"enabled": True, "serviceMonitor": {"enabled": True}}})
    services = by_kind(objects, "Service")
    monitor = only(objects, "ServiceMonitor")
    selected = [
        s for s in services if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert len(selected) == len(by_kind(objects, "DaemonSet")) == 4  # each DaemonSet's, the fallbacks' too
    pods = {tuple(sorted(d["spec"]["template"]["metadata"]["labels"].items())) for d in by_kind(objects, "DaemonSet")}
    assert {tuple(sorted(s["spec"]["selector"].items())) for s in selected} == pods
    job = monitor["spec"]["jobLabel"]
    assert len({s["metadata"]["labels"][job] for s in selected}) == 1
    (endpoint,) = monitor["spec"]["endpoints"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"} in endpoint["relabelings"]


def test_the_driver_takes_extra_env_of_its_own_over_the_shared_one() -> None:
    """`extraEnv` reaches both containers; `dra.extraEnv` the driver's only, its value winning for a name in both
    (once in the container: the API server warns of a name given twice)."""
    shared = [{"name": "IX_LOG_FORMAT", "value": "json"}, {"name": "IX_SIMULATED_DEVICES", "value": "/a/devices"}]
    own = [{"name": "IX_SIMULATED_DEVICES", "value": "/usr/local/corex/devices"}]
    objects = rendered({"dra": {"enabled": True, "extraEnv": own}, "extraEnv": shared})
    daemonsets = by_kind(objects, "DaemonSet")
    driver = driver_daemonset(objects)
    assert agent_container(driver).get("args") == ["dra"]
    (plugin,) = [d for d in daemonsets if d["metadata"]["name"] == "iluvatar-device-plugin"]
    names = [item["name"] for item in agent_container(driver)["env"]]
    assert names.count("IX_SIMULATED_DEVICES") == 1
    env, _ = _env_and_mounts(driver)
    assert env["IX_SIMULATED_DEVICES"] == "/usr/local/corex/devices" and env["IX_LOG_FORMAT"] == "json"
    plugin_env, _ = _env_and_mounts(plugin)
    assert plugin_env["IX_SIMULATED_DEVICES"] == "/a/devices"


SLICES_POLICY = "iluvatar-dra-driver-resourceslices"
PINNED_SOURCES = {
    "static": None,
    "chart": render.DRA_VALUES,
    "chart-strict": {**render.DRA_VALUES, "strict": True},
    "chart-both-modes": {"dra": {"enabled": True}},
}


@pytest.mark.parametrize("source", sorted(PINNED_SOURCES))
def test_the_slices_policy_pins_every_field_that_names_a_node(source: str) -> None:
    """The driver's slices: its node in spec.nodeName and spec.pool.name, and the node's own names (the pool's
    naming in dra/pool.py: `<node>-gpu.iluvatar.com`, `-<n>` after it, the long-name form cut with a 10-digit hash
    when the name and `-999` would pass the API server's 253), in every render and the static admission file."""
    values = PINNED_SOURCES[source]
    objects = load_file(STATIC_DIR / "ix-dra-driver-admission.yaml") if values is None else rendered(values)
    (policy,) = [p for p in by_kind(objects, "ValidatingAdmissionPolicy") if p["metadata"]["name"] == SLICES_POLICY]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert variables["sliceBase"] == f'variables.node + "{pool._SUFFIX}"'
    assert variables["longNames"] == f"size(variables.sliceBase) + {len('-999')} > {pool.MAX_NAME}"
    assert 's.spec.?nodeName.orValue("") == variables.node' in expressions
    assert 's.spec.?pool.?name.orValue("") == variables.node' in expressions
    assert "s.metadata.name == variables.sliceBase" in expressions
    assert 'substring(size(variables.sliceBase) + 1).matches("^[0-9]+$")' in expressions
    digest = len(pool.slice_base_name("n" * 240).removesuffix(pool._SUFFIX).rpartition("-")[2])
    assert f"-[0-9a-f]{{{digest}}}-gpu[.]iluvatar[.]com(-[0-9]+)?$" in expressions
