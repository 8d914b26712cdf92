"""The DaemonSets run without privilege by default, and every host path they mount is one the code uses, at the
narrowest directory, read-only unless written.

The allow-list is built from the code's own defaults, so a path the agent stops using, or a mount wider than the
directories it touches (all of the kubelet's plugins directory, /sys, /run/udev), fails here. It covers every render
of the chart the tests know and the static files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from manifest_support import STATIC_DIR, by_kind, load_file, load_render_module, needs_helm, pod_spec, render_objects

from ix_device_plugin.deviceplugin.outputs import DEFAULT_CDI_DIR
from ix_device_plugin.dra.registration import DRIVER
from ix_device_plugin.hardware.ixml.library import DEFAULT_LIBRARY_PATHS
from ix_device_plugin.healing.record import NODE_DIR
from ix_device_plugin.kubelet.podresources import DEFAULT_SOCKET
from ix_device_plugin.nodelabels.featurefile import DEFAULT_FEATURES_DIR
from ix_device_plugin.settings.table import DEFAULT_KUBELET_PLUGINS_DIR, DEFAULT_PLUGIN_DIR, DEFAULT_REGISTRAR_DIR

KUBELET_PLUGINS = Path(DEFAULT_KUBELET_PLUGINS_DIR)
COREX = Path(DEFAULT_LIBRARY_PATHS[0]).parent.parent
# The host path, and whether the agent writes there (False: the mount must be read-only).
WRITES = True
ALLOWED: dict[str, bool] = {
    DEFAULT_PLUGIN_DIR: WRITES,  # the device plugin's socket
    DEFAULT_REGISTRAR_DIR: WRITES,  # the DRA driver's registration socket
    str(KUBELET_PLUGINS / DRIVER): WRITES,  # the DRA socket, checkpoint, publisher lock, health story
    str(KUBELET_PLUGINS / NODE_DIR): WRITES,  # the node-health record and the device plugin's role lock
    str(DEFAULT_CDI_DIR): WRITES,  # CDI specs
    str(DEFAULT_FEATURES_DIR): WRITES,  # NFD's local feature file
    str(DEFAULT_SOCKET.parent): not WRITES,  # the kubelet's pod-resources socket (connecting needs no write)
    "/dev": not WRITES,  # which /dev/iluvatar* nodes exist, and their coming and going
    str(COREX): not WRITES,  # libixml.so
}

RENDERS: dict[str, dict[str, Any]] = {
    "chart-defaults": {},
    "chart-metrics": {"metrics": {"enabled": True, "serviceMonitor": {"enabled": True}}},
    "chart-dra": {"dra": {"enabled": True}, "devicePlugin": {"enabled": False}},
    "chart-both": {"dra": {"enabled": True}},
    "chart-api-features": {"features": {"perNodeConfig": True, "gpuReset": True, "volcano": True}},
    "chart-node-services-off": {
        "dra": {"enabled": True},
        "nodeFeatures": {"enabled": False},
        "telemetry": {"enabled": False},
        "cdi": {"enabled": False},
    },
}
STATIC_FILES = ("ix-device-plugin.yaml", "ix-dra-driver.yaml")


def daemonsets(source: str) -> list[dict[str, Any]]:
    objects = load_file(STATIC_DIR / source) if source in STATIC_FILES else render_objects(RENDERS[source])
    found = by_kind(objects, "DaemonSet")
    assert found, source
    return found


def host_mounts(daemonset: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(host path, path in the container, read-only) of every hostPath the DaemonSet's containers mount."""
    spec = pod_spec(daemonset)
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return [
        (host[mount["name"]], mount["mountPath"], mount.get("readOnly", False) is True)
        for container in [*spec.get("initContainers", []), *spec["containers"]]
        for mount in container.get("volumeMounts", [])
        if mount["name"] in host
    ]


@pytest.mark.parametrize("source", [*STATIC_FILES, *sorted(RENDERS)])
def test_every_host_path_is_on_the_allow_list_and_read_only_unless_written(source: str) -> None:
    for daemonset in daemonsets(source):
        name = daemonset["metadata"]["name"]
        mounts = host_mounts(daemonset)
        assert mounts, name
        for host_path, container_path, read_only in mounts:
            assert host_path in ALLOWED, f"{source}: {name} mounts {host_path}, not a path the code uses"
            # The same path inside: sockets are named to the kubelet, and CDI specs name nodes, by host path.
            assert container_path == host_path, f"{source}: {name} mounts {host_path} at {container_path}"
            if not ALLOWED[host_path]:
                assert read_only, f"{source}: {name} mounts {host_path} writable; the code only reads it"


@pytest.mark.parametrize("source", [*STATIC_FILES, *sorted(RENDERS)])
def test_no_host_path_is_mounted_twice(source: str) -> None:
    for daemonset in daemonsets(source):
        paths = [host_path for host_path, _, _ in host_mounts(daemonset)]
        assert len(paths) == len(set(paths)), daemonset["metadata"]["name"]


def containers(daemonset: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(daemonset)
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("source", [*STATIC_FILES, *sorted(RENDERS)])
def test_no_container_is_privileged_by_default(source: str) -> None:
    for daemonset in daemonsets(source):
        spec = pod_spec(daemonset)
        assert not spec.get("hostPID") and not spec.get("hostIPC") and not spec.get("hostNetwork")
        for container in containers(daemonset):
            context = container["securityContext"]
            name = f"{source}: {daemonset['metadata']['name']}"
            assert context.get("privileged", False) is False, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name  # and none added
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert context["readOnlyRootFilesystem"] is True, name


@pytest.mark.parametrize("mode", [{}, {"dra": {"enabled": True}, "devicePlugin": {"enabled": False}}])
def test_privileged_is_a_named_opt_in_without_contradicting_lines(mode: dict[str, Any]) -> None:
    (daemonset,) = by_kind(render_objects({**mode, "privileged": True}), "DaemonSet")
    (container,) = pod_spec(daemonset)["containers"]
    # A privileged container gets every capability and no seccomp filter: a drop list or a profile would mislead.
    assert container["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0}


def test_the_notes_say_how_to_opt_in_while_the_agent_is_unprivileged() -> None:
    needs_helm()
    render = load_render_module()
    assert "--set privileged=true" in render.notes()
    assert "privileged" not in render.notes(overrides={"privileged": True})
