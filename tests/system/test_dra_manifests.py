"""The DRA manifests: the chart with dra.enabled renders deployments/static/ix-dra-driver.yaml; objects are valid."""

from __future__ import annotations

from typing import Any

import manifest_support
import pytest
from manifest_support import (
    CHART_DIR,
    STATIC_DIR,
    by_kind,
    load_file,
    load_render_module,
    only,
    pod_spec,
    schema_errors,
)

from ix_device_plugin import __version__
from ix_device_plugin.dra.registration import REGISTRATION_SOCKET
from ix_device_plugin.settings.argv import parse_command_line
from ix_device_plugin.settings.resolve import resolve
from ix_device_plugin.settings.table import DRA, settings_of

render = load_render_module()


def rendered(overrides: dict[str, Any]) -> list[dict[str, Any]]:
    return render.load_objects(render.render_chart(CHART_DIR, overrides))


def test_the_chart_in_dra_mode_renders_the_static_dra_manifest() -> None:
    assert render.differences(rendered(render.DRA_VALUES), render.dra_objects(STATIC_DIR)) == []


def test_dra_objects_only_when_enabled_and_the_plugin_can_be_switched_off() -> None:
    defaults = rendered({})
    assert by_kind(defaults, "DeviceClass") == []
    assert [d["metadata"]["name"] for d in by_kind(defaults, "DaemonSet")] == ["iluvatar-device-plugin"]
    both = rendered({"dra": {"enabled": True}})
    assert sorted(d["metadata"]["name"] for d in by_kind(both, "DaemonSet")) == [
        "iluvatar-device-plugin",
        "iluvatar-dra-driver",
    ]
    selectors = [d["spec"]["selector"]["matchLabels"] for d in by_kind(both, "DaemonSet")]
    assert selectors[0] != selectors[1]  # the two DaemonSets never adopt each other's pods
    dra_only = rendered(render.DRA_VALUES)
    assert [d["metadata"]["name"] for d in by_kind(dra_only, "DaemonSet")] == ["iluvatar-dra-driver"]
    assert by_kind(dra_only, "ConfigMap") == []


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


def test_the_device_class_selects_the_driver_and_can_name_the_extended_resource() -> None:
    objects = load_file(STATIC_DIR / "ix-dra-driver.yaml")
    device_class = only(objects, "DeviceClass")
    assert device_class["metadata"]["name"] == "gpu.iluvatar.com"
    assert device_class["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "gpu.iluvatar.com"'}}]
    extended = only(
        rendered({**render.DRA_VALUES, "dra": {"enabled": True, "extendedResourceName": "iluvatar.com/gpu"}}),
        "DeviceClass",
    )
    assert extended["spec"]["extendedResourceName"] == "iluvatar.com/gpu"


def test_the_rbac_is_the_narrowest() -> None:
    role = only(load_file(STATIC_DIR / "ix-dra-driver.yaml"), "ClusterRole")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("resource.k8s.io",), ("resourceslices",)): {"get", "list", "watch", "create", "update", "delete"},
        (("resource.k8s.io",), ("resourceclaims",)): {"get"},
        (("resource.k8s.io",), ("resourceclaims/status",)): {"patch"},
        (("",), ("nodes",)): {"get"},
    }


def test_the_daemonset_runs_dra_mode_with_the_kubelets_directories_mounted() -> None:
    objects = load_file(STATIC_DIR / "ix-dra-driver.yaml")
    spec = pod_spec(only(objects, "DaemonSet"))
    (container,) = spec["containers"]
    assert container["args"] == ["dra"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    known = {setting.env for setting in settings_of(DRA)} | {"POD_NAMESPACE"}
    assert set(env) <= known  # only settings the DRA mode uses
    command = parse_command_line(container["args"], __version__)
    settings = resolve(command.mode, command.flags, {k: v for k, v in env.items() if v is not None})
    assert (command.mode, settings.unused_env) == (DRA, ())
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {
        str(settings["kubelet_registrar_directory_path"]),
        str(settings["kubelet_plugins_directory_path"]),
        str(settings["cdi_spec_dir"]),
    } <= mounts
    assert REGISTRATION_SOCKET == "gpu.iluvatar.com-reg.sock"
    pod_uid = next(item for item in container["env"] if item["name"] == "POD_UID")
    assert pod_uid["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"  # sockets named per pod
    strategy = only(objects, "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert spec["serviceAccountName"] == only(objects, "ServiceAccount")["metadata"]["name"]


def test_the_examples_ask_for_one_chip_a_whole_board_and_a_shared_claim() -> None:
    objects = load_file(STATIC_DIR / "dra-examples.yaml")
    templates = {t["metadata"]["name"]: t["spec"]["spec"]["devices"] for t in by_kind(objects, "ResourceClaimTemplate")}
    assert templates["whole-iluvatar-board"]["constraints"] == [
        {"requests": ["chips"], "matchAttribute": "gpu.iluvatar.com/boardUUID"}
    ]
    assert templates["whole-iluvatar-board"]["requests"][0]["exactly"]["count"] == 2
    shared = [p for p in by_kind(objects, "Pod") if p["spec"]["resourceClaims"][0].get("resourceClaimName")]
    assert {p["spec"]["resourceClaims"][0]["resourceClaimName"] for p in shared} == {"shared-iluvatar-gpu"}
    assert len(shared) == 2
