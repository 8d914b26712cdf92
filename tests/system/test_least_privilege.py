"""The DaemonSets run without privilege by default (but the privileged fallbacks, which run only on the nodes the
agent labelled iluvatar.com/gpu.device-access=privileged), every host path they mount is one the code uses, at
the narrowest directory, read-only unless written, and the pod's API token reaches the agent's container alone.

The allow-list is built from the code's own defaults, so a path the agent stops using, or a mount wider than the
directories it touches (all of the kubelet's plugins directory, /sys, /run/udev), fails here. It covers every render
of the chart the tests know and the static files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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
)

from ix_device_plugin.apiserver.settings import SERVICE_ACCOUNT_DIR, settings_from
from ix_device_plugin.deviceplugin.outputs import DEFAULT_CDI_DIR
from ix_device_plugin.dra.registration import DRIVER
from ix_device_plugin.hardware.ixml.library import DEFAULT_LIBRARY_PATHS
from ix_device_plugin.healing.record import NODE_DIR
from ix_device_plugin.kubelet.podresources import DEFAULT_SOCKET
from ix_device_plugin.nodelabels.featurefile import DEFAULT_FEATURES_DIR
from ix_device_plugin.settings.table import DEFAULT_KUBELET_PLUGINS_DIR, DEFAULT_PLUGIN_DIR, DEFAULT_REGISTRAR_DIR

KUBELET_PLUGINS = Path(DEFAULT_KUBELET_PLUGINS_DIR)
# nri-injector/main.go's default socket, /var/run/nri/nri.sock: containerd's and CRI-O's.
NRI_SOCKET_DIR = "/var/run/nri"
INJECTOR = "nri-injector"
# The injector reads the host's /dev where it cannot hide the container's own /dev (its HOST_DEV).
INJECTOR_HOST_DEV = "/host/dev"
COREX = Path(DEFAULT_LIBRARY_PATHS[0]).parent.parent
# The host path, and whether the agent writes there (False: the mount must be read-only).
WRITES = True
ALLOWED: dict[str, bool] = {
    DEFAULT_PLUGIN_DIR: WRITES,  # the device plugin's socket
    DEFAULT_REGISTRAR_DIR: WRITES,  # the DRA driver's registration socket
    str(KUBELET_PLUGINS / DRIVER): WRITES,  # the DRA socket, checkpoint, health story, the old lock names
    str(KUBELET_PLUGINS / NODE_DIR): WRITES,  # the node-health record, the node's role and reset locks (both modes)
    str(DEFAULT_CDI_DIR): WRITES,  # CDI specs
    str(DEFAULT_FEATURES_DIR): WRITES,  # NFD's local feature file
    str(DEFAULT_SOCKET.parent): not WRITES,  # the kubelet's pod-resources socket (connecting needs no write)
    "/dev": not WRITES,  # which /dev/iluvatar* nodes exist, and their coming and going
    str(COREX): not WRITES,  # libixml.so; the reset helper's ixsmi
    NRI_SOCKET_DIR: not WRITES,  # the NRI injector's runtime socket (connecting needs no write)
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
# The node label the agent writes, which splits a node's agent between the unprivileged DaemonSet and its privileged
# fallback (ix_device_plugin.core.deviceaccess.ACCESS_LABEL).
ACCESS_LABEL = "iluvatar.com/gpu.device-access"
ON_PRIVILEGED_NODES = {"key": ACCESS_LABEL, "operator": "In", "values": ["privileged"]}
OFF_PRIVILEGED_NODES = {"key": ACCESS_LABEL, "operator": "NotIn", "values": ["privileged"]}


def daemonsets(source: str) -> list[dict[str, Any]]:
    objects = load_file(STATIC_DIR / source) if source in STATIC_FILES else render_objects(RENDERS[source])
    found = by_kind(objects, "DaemonSet")
    assert found, source
    return found


def node_terms(daemonset: dict[str, Any]) -> list[dict[str, Any]]:
    """The required nodeSelectorTerms of the DaemonSet's pods (empty: none)."""
    affinity = pod_spec(daemonset).get("affinity") or {}
    required = affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return required.get("nodeSelectorTerms") or []


def is_fallback(daemonset: dict[str, Any]) -> bool:
    """A privileged fallback DaemonSet: named so, and every one of its pods' node terms requires the label
    iluvatar.com/gpu.device-access=privileged (so it runs nowhere else)."""
    terms = node_terms(daemonset)
    return (
        daemonset["metadata"]["name"].endswith("-privileged")
        and bool(terms)
        and all(ON_PRIVILEGED_NODES in term.get("matchExpressions", []) for term in terms)
    )


def unprivileged(source: str) -> list[dict[str, Any]]:
    """The DaemonSets of source but the privileged fallbacks."""
    return [daemonset for daemonset in daemonsets(source) if not is_fallback(daemonset)]


def host_mounts(daemonset: dict[str, Any], only: str | None = None) -> list[tuple[str, str, bool]]:
    """(host path, path in the container, read-only) of every hostPath the DaemonSet's containers (or container
    `only`) mount."""
    spec = pod_spec(daemonset)
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return [
        (host[mount["name"]], mount["mountPath"], mount.get("readOnly", False) is True)
        for container in [*spec.get("initContainers", []), *spec["containers"]]
        if only is None or container["name"] == only
        for mount in container.get("volumeMounts", [])
        if mount["name"] in host
    ]


def in_container_path(host_path: str, container: str | None) -> str:
    """Where host_path is mounted: the same path (sockets are named to the kubelet, and CDI specs name nodes, by
    host path), but the injector's view of the host's /dev."""
    return INJECTOR_HOST_DEV if container == INJECTOR and host_path == "/dev" else host_path


@pytest.mark.parametrize("source", [*STATIC_FILES, *sorted(RENDERS)])
def test_every_host_path_is_on_the_allow_list_and_read_only_unless_written(source: str) -> None:
    for daemonset in daemonsets(source):
        name = daemonset["metadata"]["name"]
        assert host_mounts(daemonset), name
        for container in containers(daemonset):
            for host_path, container_path, read_only in host_mounts(daemonset, container["name"]):
                assert host_path in ALLOWED, f"{source}: {name} mounts {host_path}, not a path the code uses"
                where = in_container_path(host_path, container["name"])
                assert container_path == where, f"{source}: {name} mounts {host_path} at {container_path}"
                if not ALLOWED[host_path]:
                    assert read_only, f"{source}: {name} mounts {host_path} writable; the code only reads it"


@pytest.mark.parametrize("source", [*STATIC_FILES, *sorted(RENDERS)])
def test_no_host_path_is_mounted_twice(source: str) -> None:
    for daemonset in daemonsets(source):
        for container in containers(daemonset):
            paths = [host_path for host_path, _, _ in host_mounts(daemonset, container["name"])]
            assert len(paths) == len(set(paths)), (daemonset["metadata"]["name"], container["name"])


HOST_DEV_MOUNTS_HIDDEN = ("pts", "shm")  # the host's terminals and shared memory, recursive submounts of its /dev


@pytest.mark.parametrize("source", [*STATIC_FILES, *sorted(RENDERS)])
def test_under_every_mount_of_the_hosts_dev_its_terminals_and_shared_memory_are_hidden(source: str) -> None:
    """A CRI bind mount is recursive and `readOnly` holds for its top only: a container mounting the host's /dev also
    gets its /dev/pts (root's terminals, read and written) and /dev/shm. Each such mount has empty folders of the pod's
    own (emptyDir) over both, the terminals' read-only; nothing of the host is mounted there."""
    for daemonset in daemonsets(source):
        spec = pod_spec(daemonset)
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in containers(daemonset):
            mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
            for host_path, at, _ in host_mounts(daemonset, container["name"]):
                if host_path != "/dev":
                    continue
                for hidden in HOST_DEV_MOUNTS_HIDDEN:
                    mask = mounts.get(f"{at}/{hidden}")
                    where = f"{source}: {daemonset['metadata']['name']} {container['name']} {at}/{hidden}"
                    assert mask is not None, f"{where}: the host's, not hidden"
                    assert set(volumes[mask["name"]]) == {"name", "emptyDir"}, where
                pts = mounts[f"{at}/pts"]
                assert pts.get("readOnly") is True, f"{source}: {at}/pts must be read-only"


def containers(daemonset: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(daemonset)
    return [*spec.get("initContainers", []), *spec["containers"]]


PRIVILEGED_CONTEXT = {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0}


@pytest.mark.parametrize("source", [*STATIC_FILES, *sorted(RENDERS)])
def test_no_container_is_privileged_by_default(source: str) -> None:
    """None but the privileged fallback DaemonSets', which run only on the nodes labelled
    iluvatar.com/gpu.device-access=privileged (and the unprivileged DaemonSet beside each keeps off those), and the
    reset helper beside each unprivileged agent, which mounts no host path but CoreX read-only (ixsmi) and its
    pod's own socket folder, and holds no token."""
    fallbacks = [daemonset for daemonset in daemonsets(source) if is_fallback(daemonset)]
    for daemonset in daemonsets(source):
        spec = pod_spec(daemonset)
        assert not spec.get("hostPID") and not spec.get("hostIPC") and not spec.get("hostNetwork")
        name = f"{source}: {daemonset['metadata']['name']}"
        if is_fallback(daemonset):
            (container,) = spec["containers"]  # the agent alone, no sidecar, no reset helper
            assert "initContainers" not in spec, name
            assert container["securityContext"] == PRIVILEGED_CONTEXT
            continue
        if fallbacks:
            assert all(OFF_PRIVILEGED_NODES in term["matchExpressions"] for term in node_terms(daemonset)), name
        helper = [c for c in spec["containers"] if c["name"] == RESET_HELPER]
        assert len(helper) == 1, name  # resetHelper.enabled by default
        assert helper[0]["securityContext"] == PRIVILEGED_CONTEXT, name
        assert "ports" not in helper[0] and not {"startupProbe", "livenessProbe", "readinessProbe"} & set(helper[0])
        agent_paths = {host: at for host, at, _ in host_mounts(daemonset, agent_container(daemonset)["name"])}
        # CoreX (ixsmi) where the agent has it, read-only, and no other host path
        assert host_mounts(daemonset, RESET_HELPER) == [(str(COREX), agent_paths[str(COREX)], True)], name
        for container in containers(daemonset):
            if container["name"] == RESET_HELPER:
                continue
            context = container["securityContext"]
            assert context.get("privileged", False) is False, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name  # and none added
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert context["readOnlyRootFilesystem"] is True, name
    # one fallback per unprivileged DaemonSet, named after it
    names = {daemonset["metadata"]["name"] for daemonset in unprivileged(source)}
    assert {daemonset["metadata"]["name"] for daemonset in fallbacks} == {f"{name}-privileged" for name in names}


MODES = [{}, {"dra": {"enabled": True}, "devicePlugin": {"enabled": False}}]


@pytest.mark.parametrize("opt_in", [{"privileged": True}, {"deviceInjection": "privileged"}])
@pytest.mark.parametrize("mode", MODES)
def test_privileged_is_a_named_opt_in_without_contradicting_lines(mode: dict[str, Any], opt_in: dict[str, Any]) -> None:
    (daemonset,) = by_kind(render_objects({**mode, **opt_in}), "DaemonSet")
    (container,) = pod_spec(daemonset)["containers"]  # no reset helper: the agent resets chips itself
    # A privileged container gets every capability and no seccomp filter: a drop list or a profile would mislead.
    assert container["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True, "runAsUser": 0}
    assert "initContainers" not in pod_spec(daemonset)  # nothing to inject: no sidecar holding the NRI socket


@pytest.mark.parametrize("source", [*STATIC_FILES, *sorted(RENDERS)])
def test_by_default_the_nri_injector_gives_the_agent_its_devices_and_mounts_only_the_socket_and_dev(
    source: str,
) -> None:
    for daemonset in unprivileged(source):
        spec = pod_spec(daemonset)
        agent = agent_container(daemonset)
        (injector,) = spec["initContainers"]
        assert injector["name"] == INJECTOR and injector["restartPolicy"] == "Always"  # a native sidecar
        assert injector["startupProbe"]["exec"]["command"] == ["/ix-nri-injector", "ready"]  # ready once registered
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in injector["env"]}
        assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}  # its own pod, from the downward API
        assert env["AGENT_CONTAINER"] == agent["name"]
        assert env["HOST_DEV"] == INJECTOR_HOST_DEV and env["NRI_SOCKET"] == f"{NRI_SOCKET_DIR}/nri.sock"
        mounts = sorted(host_mounts(daemonset, INJECTOR))
        assert mounts == [("/dev", INJECTOR_HOST_DEV, True), (NRI_SOCKET_DIR, NRI_SOCKET_DIR, True)], source
        # The agent keeps the host's /dev, so it sees the nodes come and go; the injected ones its cgroup allows.
        assert ("/dev", "/dev", True) in host_mounts(daemonset, agent["name"])
        # It reads the injector's status file (registered, or why not) from their shared state, read-only.
        agent_env = {e["name"]: e.get("value") for e in agent["env"]}
        assert agent_env["IX_NRI_STATUS"] == env["STATUS_FILE"] == "/run/ix-nri-injector/status"
        (state,) = [m for m in agent["volumeMounts"] if m["name"] == "nri-injector-state"]
        assert state == {"name": "nri-injector-state", "mountPath": "/run/ix-nri-injector", "readOnly": True}
        (volume,) = [v for v in spec["volumes"] if v["name"] == "nri-injector-state"]
        assert "emptyDir" in volume


@pytest.mark.parametrize("mode", MODES)
def test_a_runtime_that_injects_the_nodes_itself_gets_no_sidecar_and_no_privilege(mode: dict[str, Any]) -> None:
    found = by_kind(render_objects({**mode, "deviceInjection": "runtime"}), "DaemonSet")
    (daemonset,) = [d for d in found if not is_fallback(d)]  # and its privileged fallback, for nodes without
    assert "initContainers" not in pod_spec(daemonset)
    assert not any(v.get("hostPath", {}).get("path") == NRI_SOCKET_DIR for v in pod_spec(daemonset)["volumes"])
    assert agent_container(daemonset)["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_notes_say_how_devices_reach_the_agent_and_what_the_reset_needs() -> None:
    needs_helm()
    render = load_render_module()
    default = render.notes()
    assert "nri-injector" in default and "iluvatar-device-plugin-privileged" in default  # the fallback, per node
    assert "reset-helper" in default and "--set privileged=true" not in default  # the GPU reset beside the agent
    no_fallback = render.notes(overrides={"features": {"deviceAccessLabel": False}})
    assert "nri-injector" in no_fallback and "--set deviceInjection=privileged" in no_fallback
    assert "--set deviceInjection=nri" in render.notes(overrides={"deviceInjection": "runtime"})
    privileged = render.notes(overrides={"privileged": True})  # nothing about running without privilege
    assert "without privilege" not in privileged and "nri-injector" not in privileged
    assert "--set privileged=true" not in privileged and "--set deviceInjection=privileged" not in privileged


# The kubelet's automount of a pod's ServiceAccount token (the ServiceAccount admission plugin's TokenVolumeSource,
# kubernetes plugin/pkg/admission/serviceaccount/admission.go): the agent's container mounts the same, under the
# name that plugin gives it (without its random suffix), where in-cluster clients read it.
NAMESPACE_FIELD: dict[str, Any] = {"apiVersion": "v1", "fieldPath": "metadata.namespace"}
TOKEN_VOLUME: dict[str, Any] = {
    "name": "kube-api-access",
    "projected": {
        "defaultMode": 0o644,
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": NAMESPACE_FIELD}]}},
        ],
    },
}
TOKEN_MOUNT = {"name": "kube-api-access", "mountPath": str(SERVICE_ACCOUNT_DIR), "readOnly": True}


# Both agents with every feature that talks to the API server off: the device plugin runs as no ServiceAccount.
NO_API = {
    "dra": {"enabled": True},
    "features": dict.fromkeys(("perNodeConfig", "gpuReset", "volcano", "selfHealing", "deviceAccessLabel"), False),
}


@pytest.mark.parametrize("source", [*STATIC_FILES, *sorted(RENDERS), "chart-no-api"])
def test_only_the_agents_container_gets_the_api_token(source: str) -> None:
    """No pod automounts its ServiceAccount token (the kubelet would give it to every container, the NRI injector
    sidecar too); the agent's container alone mounts it, as the automount would, and only where the pod runs as a
    ServiceAccount (a feature that talks to the API server; the DRA driver always)."""
    found = by_kind(render_objects(NO_API), "DaemonSet") if source == "chart-no-api" else daemonsets(source)
    assert sum("serviceAccountName" not in pod_spec(d) for d in found) == (1 if source == "chart-no-api" else 0)
    for daemonset in found:
        spec = pod_spec(daemonset)
        name = f"{source}: {daemonset['metadata']['name']}"
        assert spec["automountServiceAccountToken"] is False, name
        agent = agent_container(daemonset)
        # beside every unprivileged agent the reset helper, which gets none either
        assert any(c["name"] == RESET_HELPER for c in spec["containers"]) is not is_fallback(daemonset), name
        token_mounts = [
            (container["name"], mount)
            for container in containers(daemonset)
            for mount in container.get("volumeMounts", [])
            if mount["name"] == TOKEN_MOUNT["name"] or mount["mountPath"].startswith("/var/run/secrets")
        ]
        credentials = [
            v for v in spec["volumes"] if v["name"] == TOKEN_VOLUME["name"] or {"projected", "secret"} & set(v)
        ]
        for sidecar in spec.get("initContainers", []):
            assert sidecar["name"] == INJECTOR and all(who != sidecar["name"] for who, _ in token_mounts), name
        if "serviceAccountName" in spec:
            assert token_mounts == [(agent["name"], TOKEN_MOUNT)], name
            assert credentials == [TOKEN_VOLUME], name
        else:
            assert token_mounts == [] and credentials == [], name


def test_the_api_token_volume_holds_the_files_the_agent_reads_there(tmp_path: Path) -> None:
    """apiserver/settings.py finds the API server with the token, the CA and the namespace the volume projects."""
    sources = TOKEN_VOLUME["projected"]["sources"]
    files = [
        sources[0]["serviceAccountToken"]["path"],
        *(item["path"] for s in sources[1:] for item in s[next(iter(s))]["items"]),
    ]
    for name in files:
        (tmp_path / name).write_text(f"{name}-content")
    env = {"NODE_NAME": "node-a", "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    found = settings_from(env, None, "the test", service_account_dir=tmp_path)
    assert found.in_cluster is not None
    assert (found.in_cluster.token_file, found.in_cluster.ca_file) == (tmp_path / "token", tmp_path / "ca.crt")
    assert found.namespace == "namespace-content"  # no POD_NAMESPACE: the projected namespace file
