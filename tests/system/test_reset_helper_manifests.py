"""The GPU reset helper: a privileged container `reset-helper` beside each unprivileged agent (resetHelper), which the
agent asks over a socket in its pod's own memory folder; none in strict mode, in the privileged fallbacks, beside a
privileged agent or with resetHelper.enabled=false; and the agent told how it resets (IX_RESET_VIA).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.manifest_support import (
    RESET_HELPER,
    STATIC_DIR,
    agent_container,
    by_kind,
    load_file,
    load_render_module,
    needs_helm,
    pod_spec,
    render_objects,
    reset_helper_container,
    schema_errors,
)

from ix_device_plugin.settings.table import DEFAULT_IXSMI

render = load_render_module()

PLUGIN, DRA = "iluvatar-device-plugin", "iluvatar-dra-driver"
BOTH = {"dra": {"enabled": True}}
COREX = "/usr/local/corex"  # corexPath's default, where the DRA driver always mounts it
SOCKET_DIR = "/run/ix-reset"
SOCKET = f"{SOCKET_DIR}/reset.sock"
PRIVILEGED_CONTEXT = {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0}
SOCKET_VOLUME = {"name": "reset-socket", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
AGENT_MOUNT = {"name": "reset-socket", "mountPath": SOCKET_DIR, "readOnly": True}  # connecting needs no write


def daemonsets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {ds["metadata"]["name"]: ds for ds in by_kind(objects, "DaemonSet")}


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])}


def helper_of(ds: dict[str, Any]) -> dict[str, Any]:
    helper = reset_helper_container(ds)
    assert helper is not None, ds["metadata"]["name"]
    return helper


def assert_no_helper(ds: dict[str, Any], via: str) -> None:
    """No helper, no socket folder, and the agent told to reset `via` (local or none)."""
    name = ds["metadata"]["name"]
    assert reset_helper_container(ds) is None, name
    assert not any(v["name"] == SOCKET_VOLUME["name"] for v in pod_spec(ds)["volumes"]), name
    agent = agent_container(ds)
    assert not any(m["name"] == SOCKET_VOLUME["name"] for m in agent["volumeMounts"]), name
    assert env(agent)["IX_RESET_VIA"] == via and "IX_RESET_HELPER_SOCKET" not in env(agent), name


@pytest.mark.parametrize("source", ["chart", "chart-runtime", "static"])
def test_by_default_each_unprivileged_agent_has_the_reset_helper_beside_it(source: str) -> None:
    if source == "static":
        objects = load_file(STATIC_DIR / "ix-device-plugin.yaml") + load_file(STATIC_DIR / "ix-dra-driver.yaml")
    else:
        objects = render_objects({**BOTH, **({"deviceInjection": "runtime"} if source == "chart-runtime" else {})})
    found = daemonsets(objects)
    assert sorted(found) == [PLUGIN, f"{PLUGIN}-privileged", DRA, f"{DRA}-privileged"]
    for name in (PLUGIN, DRA):
        ds = found[name]
        spec, agent, helper = pod_spec(ds), agent_container(ds), helper_of(ds)
        assert schema_errors(ds) == [], name
        # the agent first: kubectl's default container (logs, exec) stays the agent's
        assert [c["name"] for c in spec["containers"]] == [agent["name"], RESET_HELPER]
        assert (helper["image"], helper["imagePullPolicy"]) == (agent["image"], agent["imagePullPolicy"])
        assert "command" not in helper and helper["args"] == ["reset-helper"]  # the image's ix-device-plugin
        assert helper["securityContext"] == PRIVILEGED_CONTEXT, name
        assert not {"ports", "startupProbe", "livenessProbe", "readinessProbe"} & set(helper), name
        assert env(helper) == {
            "IX_RESET_HELPER_SOCKET": SOCKET,
            "IX_IXSMI_PATH": DEFAULT_IXSMI,  # in the CoreX the agent sees, where the agent looks
            "IX_BACKEND": "ixml",
            "IX_RESET_HELPER_MAX_PER_MINUTE": "12",
        }, name
        assert f"{COREX}/bin/ixsmi" == DEFAULT_IXSMI
        # its socket folder, written, and CoreX read-only at the agent's path: nothing else, no token
        assert helper["volumeMounts"] == [
            {"name": "reset-socket", "mountPath": SOCKET_DIR},
            {"name": "corex", "mountPath": COREX, "readOnly": True},
        ], name
        assert {"name": "corex", "mountPath": COREX, "readOnly": True} in agent["volumeMounts"], name
        assert spec["automountServiceAccountToken"] is False, name
        assert helper["resources"] == {"requests": {"cpu": "5m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}
        # the agent: told to ask the helper, where, and with the folder read-only
        assert (env(agent)["IX_RESET_VIA"], env(agent)["IX_RESET_HELPER_SOCKET"]) == ("helper", SOCKET), name
        assert AGENT_MOUNT in agent["volumeMounts"], name
        assert SOCKET_VOLUME in spec["volumes"], name
        # no other container shares the socket
        sharing = [c["name"] for c in [*spec.get("initContainers", []), *spec["containers"]]
                   if any(m["name"] == "reset-socket" for m in c.get("volumeMounts", []))]  # fmt: skip
        assert sharing == [agent["name"], RESET_HELPER], name
        # the privileged fallback's agent resets chips itself
        assert_no_helper(found[f"{name}-privileged"], "local")


@pytest.mark.parametrize(
    ("values", "via"),
    [
        ({"strict": True}, "none"),
        ({"strict": True, "resetHelper": {"enabled": True}}, "none"),  # strict wins: no error, no helper
        ({"strict": True, "deviceInjection": "runtime"}, "none"),
        ({"resetHelper": {"enabled": False}}, "none"),
        ({"privileged": True}, "local"),
        ({"deviceInjection": "privileged"}, "local"),
    ],
    ids=["strict", "strict-and-enabled", "strict-runtime", "disabled", "privileged", "deviceInjection-privileged"],
)
def test_no_reset_helper_where_the_agent_is_privileged_strict_or_it_is_off(values: dict[str, Any], via: str) -> None:
    found = daemonsets(render_objects({**BOTH, **values}))
    assert {PLUGIN, DRA} <= set(found)
    for name, ds in found.items():
        fallback = name.endswith("-privileged")
        assert_no_helper(ds, "local" if fallback else via)
        if via == "none" and not fallback:  # nothing privileged beside an unprivileged agent
            assert not any(c["securityContext"].get("privileged") for c in pod_spec(ds)["containers"]), name


def test_the_helpers_values_and_the_agents_extra_variables_reach_it() -> None:
    """maxResetsPerMinute, backend and corexPath (where it finds ixsmi); `extraEnv` (and on DRA nodes `dra.extraEnv`
    over it) as its agent gets them, a variable given there taking the place of its own (once in the container)."""
    shared = [
        {"name": "IX_LOG_FORMAT", "value": "json"},
        {"name": "IX_SIMULATED_DEVICES", "value": "/opt/corex/devices"},
        {"name": "IX_RESET_TIMEOUT", "value": "30"},
    ]
    own = [{"name": "IX_SIMULATED_DEVICES", "value": f"{COREX}/devices"}, {"name": "IX_IXSMI_PATH", "value": "/x"}]
    values = {
        "dra": {"enabled": True, "extraEnv": own},
        "extraEnv": shared,
        "corexPath": "/opt/corex",
        "backend": "simulated",
        "resetHelper": {"maxResetsPerMinute": 3, "resources": {"requests": {"cpu": "1m"}}},
    }
    found = daemonsets(render_objects(values))
    plugin, driver = helper_of(found[PLUGIN]), helper_of(found[DRA])
    for helper in (plugin, driver):
        names = [item["name"] for item in helper["env"]]
        assert len(names) == len(set(names)), names  # the API server warns of a name given twice
        assert helper["resources"]["requests"] == {"cpu": "1m", "memory": "32Mi"}
    assert env(plugin) == {
        "IX_RESET_HELPER_SOCKET": SOCKET,
        "IX_IXSMI_PATH": "/opt/corex/bin/ixsmi",
        "IX_BACKEND": "simulated",
        "IX_RESET_HELPER_MAX_PER_MINUTE": "3",
        "IX_LOG_FORMAT": "json",
        "IX_SIMULATED_DEVICES": "/opt/corex/devices",
        "IX_RESET_TIMEOUT": "30",
    }
    assert {"name": "corex", "mountPath": "/opt/corex", "readOnly": True} in plugin["volumeMounts"]
    assert env(driver) == {
        "IX_RESET_HELPER_SOCKET": SOCKET,
        "IX_BACKEND": "simulated",
        "IX_RESET_HELPER_MAX_PER_MINUTE": "3",
        "IX_LOG_FORMAT": "json",
        "IX_RESET_TIMEOUT": "30",
        "IX_SIMULATED_DEVICES": f"{COREX}/devices",
        "IX_IXSMI_PATH": "/x",
    }
    assert {"name": "corex", "mountPath": COREX, "readOnly": True} in driver["volumeMounts"]
    for name, helper in ((PLUGIN, plugin), (DRA, driver)):  # the extra variables as its agent has them
        agent = env(agent_container(found[name]))
        assert all(agent[item["name"]] == env(helper)[item["name"]] for item in shared), name
    assert env(agent_container(found[DRA]))["IX_IXSMI_PATH"] == "/x"


@pytest.mark.parametrize(
    "values",
    [{}, {"strict": True}, {"resetHelper": {"enabled": False}}, BOTH, {**BOTH, "strict": True}],
    ids=["defaults", "strict", "disabled", "with-dra", "with-dra-strict"],
)
def test_helm_lint_strict_is_clean(values: dict[str, Any], tmp_path: Path) -> None:
    needs_helm()
    args = ["lint", "--strict", str(render.CHART_DIR)]
    if values:
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["--values", str(path)]
    output = render.helm(*args)  # CalledProcessError on a finding
    assert "1 chart(s) linted, 0 chart(s) failed" in output, output


def test_the_notes_say_where_resets_run_and_where_they_are_unavailable() -> None:
    needs_helm()
    default = render.notes()
    assert "in the container reset-helper beside the agent" in default and "at most 12 a minute" in default
    strict = render.notes(overrides={"strict": True})
    assert "GPU resets are unavailable in strict mode" in strict and "reset-helper" not in strict
    off = render.notes(overrides={"resetHelper": {"enabled": False}})
    assert "resetHelper.enabled is false: GPU resets" in off and "are unavailable" in off
    assert "reset-helper" not in render.notes(overrides={"privileged": True})
