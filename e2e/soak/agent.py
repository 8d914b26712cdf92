"""The agent under soak as operators run it: the chart's DaemonSet (`helm install` of deployments/helm/ix-device-plugin
with the project's image) over the soak's simulated hardware, healing through the ixsmi stand-in.

It runs privileged (`deviceInjection: privileged`), as a node that should reset its chips by itself must (README,
"Resets need `privileged`"). The simulated hardware is where the pod already looks: the devices file and the ixsmi
stand-in in the folder the chart mounts as CoreX's (`corexPath`, read-only), the stand-in's reset log in the node
feature folder (`nodeFeatures.dir`, writable, the same path in the pod as on the host). Where the chart runs the
reset in its `reset-helper` container (an unprivileged agent: the stand-in runs there), that folder is the helper's
too, at the same path (`resetHelper.extraVolumes` and `extraVolumeMounts`, in both DaemonSets). Settings the chart
has no value for go through `extraEnv` (IX_SIMULATED_DEVICES, IX_IXSMI_PATH, IX_RESET_TIMEOUT), which the helper
takes too.

Both DaemonSets are installed, whatever the soak's mode, and the node's labels say which one runs there (docs/dra.md
"Moving a node to DRA"): `iluvatar.com/gpu.present=true` always, `iluvatar.com/gpu.dra=true` while DRA acts. The
driver mounts corexPath at /usr/local/corex, so its paths into it go through `dra.extraEnv`.

Faults on it: killed (SIGKILL to the container's main process: the kubelet restarts the container), restarted (the
pod deleted: the DaemonSet makes another), rolled out (`helm upgrade` changing a pod annotation), rolled back
(`helm rollback`), its config changed live (`helm upgrade` of `config.content`: the ConfigMap, no rollout), the node
switched to the other mode and back (its `iluvatar.com/gpu.dra` label set or removed, without a drain).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from harness.cluster import CGROUP_ROOT, Cluster
from harness.helm import CHART, Helm
from harness.kube import KubectlError, Obj
from harness.waits import WaitFailed, until

from .hardware import Hardware
from .schedule import DEVICE_PLUGIN_CONFIGS

RELEASE = "ix-device-plugin"
NAMESPACE = "kube-system"
APP = {"device-plugin": "iluvatar-device-plugin", "dra": "iluvatar-dra-driver"}
PRESENT_LABEL, DRA_LABEL = "iluvatar.com/gpu.present", "iluvatar.com/gpu.dra"
ROLLOUT_ANNOTATION = "soak.iluvatar.com/rollout"
RESET_TIMEOUT_S = 10
READY_S = 240
DRA_COREX = "/usr/local/corex"  # where the DRA driver's pod mounts corexPath (the device plugin's: at corexPath)
PROGRAM = "ix-device-plugin"
STALLED_S = 45.0  # no pod of the DaemonSet this long after one was asked for: its controller has stalled
KILLS_BEFORE_BACKOFF = 2  # the kubelet's back-off before a third restart of a container is 40 s


class Agent:
    def __init__(self, cluster: Cluster, mode: str, workdir: Path, hardware: Hardware) -> None:
        self.cluster, self.mode, self.workdir, self.hardware = cluster, mode, workdir, hardware
        self.acting = mode  # the mode the node runs now: the soak's, or the other one during a switch
        self.helm = Helm(cluster.binaries["helm"], workdir, cluster.kubeconfig("admin"))
        self.base_config: dict[str, Any] = {}  # under every config the soak sets (a self-test: `health: {ignore}`)
        self.overrides: dict[str, Any] = {}  # chart values over the soak's (a self-test: a careless updateStrategy)
        # More of each agent container's environment, given where its pod sees CoreX's folder (a self-test: breaks.py)
        self.extra_env: Callable[[Path], list[dict[str, str]]] = lambda corex: []
        self.config_index = 1
        self.rollouts = 0
        self.revisions: list[tuple[int, int]] = []  # (config index, rollout count) of each helm revision, in order
        self.installed = False
        self.starts = 0
        self.controller_restarts = 0  # the stalled DaemonSet controller restarted
        self._pids: list[int] = []
        self.followed: dict[str, subprocess.Popen[bytes]] = {}  # pod/container -> its `kubectl logs -f`, to its end

    @property
    def app(self) -> str:
        return APP[self.acting]

    # ------------------------------------------------------------------ the release

    def values(self) -> dict[str, Any]:
        cluster, hardware = self.cluster, self.hardware
        config = self.base_config | DEVICE_PLUGIN_CONFIGS[self.config_index]
        values: dict[str, Any] = {
            "backend": "simulated",
            "deviceInjection": "privileged",
            "devicePluginPath": str(cluster.device_plugin_dir),
            "kubeletPluginsPath": str(cluster.plugins_dir),
            "corexPath": str(hardware.corex),
            "cdi": {"specDir": str(cluster.cdi_dir)},
            "nodeFeatures": {"dir": str(hardware.state)},
            "resetHelper": reset_helper_values(hardware.state),
            "telemetry": {"interval": 2, "podResources": {"dir": str(cluster.pod_resources_socket.parent)}},
            "config": {"content": yaml.safe_dump(config, sort_keys=False)},
            "podAnnotations": {ROLLOUT_ANNOTATION: str(self.rollouts)},
            "extraEnv": [
                *self.hardware_env(hardware.corex),
                {"name": "IX_RESET_TIMEOUT", "value": str(RESET_TIMEOUT_S)},  # a hanging ixsmi is given up on
                {"name": "IX_HEALTH_INTERVAL", "value": "0.5"},
            ],
            "dra": {
                "enabled": True,
                "extraEnv": self.hardware_env(Path(DRA_COREX)),
                "kubeletRegistrarDirectoryPath": str(cluster.plugins_registry_dir),
                "kubeletPluginsDirectoryPath": str(cluster.plugins_dir),
            },
        }
        return values | self.overrides

    def hardware_env(self, corex: Path) -> list[dict[str, str]]:
        """The simulated devices file and the ixsmi stand-in, where a pod mounting CoreX's folder at corex sees them."""
        return [
            {"name": "IX_SIMULATED_DEVICES", "value": str(corex / self.hardware.devices.name)},
            {"name": "IX_IXSMI_PATH", "value": str(corex / self.hardware.ixsmi.name)},
            *self.extra_env(corex),
        ]

    def _release(self, verb: str) -> None:
        path = self.helm.values_file(self.values(), f"values-{len(self.revisions) + 1}")
        self.helm(verb, RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(path))
        self.revisions.append((self.config_index, self.rollouts))

    def start(self, timeout: float = READY_S) -> None:
        """`helm install` (the node labelled as the chart's affinity asks), then one pod Ready."""
        self.acting = self.mode
        self.label_node()
        self._release("install")
        self.installed = True
        self.starts += 1
        self.wait_settled(timeout)

    def stop(self) -> None:
        """`helm uninstall --wait`: the pods stopped (SIGTERM, as a node drain or an uninstall does)."""
        if not self.installed:
            return
        self.installed = False
        with contextlib.suppress(AssertionError):
            self.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s")
        until(lambda: not any(self.pods(app) for app in APP.values()), 120, "the agent's pods gone", [])
        self.cluster.admin("label", "node", self.cluster.node_name, f"{PRESENT_LABEL}-", f"{DRA_LABEL}-")
        self.stop_following()

    def label_node(self) -> None:
        dra = f"{DRA_LABEL}=true" if self.acting == "dra" else f"{DRA_LABEL}-"
        self.cluster.admin("label", "node", self.cluster.node_name, f"{PRESENT_LABEL}=true", dra, "--overwrite")

    def switch(self, to: str) -> None:
        """The node switched to mode `to` as docs/dra.md says, without the drain (the workload's pods stay): its
        `iluvatar.com/gpu.dra` label set or removed; returns once that mode's pod is Ready. The other mode's pod
        leaves as the kubelet stops it, in no fixed order with the new one's start."""
        self.acting = to
        self.label_node()
        self.starts += 1
        self.wait_settled()

    def set_config(self, index: int) -> None:
        """The config as `helm upgrade` of `config.content` sets it (the ConfigMap only: no rollout), once the
        running pod's mounted file says it (the kubelet syncs ConfigMap volumes every few seconds)."""
        self.config_index = index
        if self.installed:
            self._release("upgrade")
            self.wait_config_seen()

    def rollout(self) -> None:
        """`helm upgrade` changing a pod annotation: the DaemonSet rolls its pods (the chart's updateStrategy)."""
        self.rollouts += 1
        self._release("upgrade")

    def rollback(self) -> int:
        """`helm rollback` to the revision before the last; the config index now in force."""
        self.helm("rollback", RELEASE, "--namespace", NAMESPACE)
        self.config_index, self.rollouts = self.revisions[-2]
        self.revisions.append(self.revisions[-2])
        self.wait_config_seen()
        return self.config_index

    # ------------------------------------------------------------------ the pods

    def pods(self, app: str = "") -> list[Obj]:
        return self.cluster.admin.items("pods", NAMESPACE, "-l", f"app.kubernetes.io/name={app or self.app}")

    def newest(self) -> Obj:
        """The newest pod with a running container (during a rollout: the one that will serve)."""
        running = [pod for pod in self.pods() if container_id(pod)]
        assert running, f"no {self.app} pod running"
        return max(running, key=lambda pod: pod["metadata"]["creationTimestamp"])

    def settled(self, daemonset: Obj | None, pods: list[Obj]) -> bool:
        """The DaemonSet's rollout is over: its spec observed, its pod up to date and available, no other pod."""
        if daemonset is None:
            return False
        status = daemonset.get("status") or {}
        want = status.get("desiredNumberScheduled", -1)
        return (
            status.get("observedGeneration") == daemonset["metadata"].get("generation")
            and status.get("updatedNumberScheduled") == want == status.get("numberAvailable")
            and not status.get("numberUnavailable")
            and len(pods) == want
            and all(ready(pod) for pod in pods)
        )

    def daemonset(self) -> Obj | None:
        return self.cluster.admin.get_or_none("daemonset", self.app, NAMESPACE)

    def wait_settled(self, timeout: float = READY_S, other_than: str = "") -> Obj:
        """The one pod Ready and up to date, and its container not `other_than` (a container ID)."""

        def one() -> Obj | None:
            pods = self.pods()
            if not self.settled(self.daemonset(), pods) or container_id(pods[0]) in ("", other_than):
                return None
            return pods[0]

        logs = [self.cluster.processes["kubelet"].log, self.cluster.processes["containerd"].log]
        try:
            pod: Obj = until(one, min(timeout, STALLED_S), f"the {self.app} pod Ready", logs, interval=1)
        except WaitFailed:
            if not self.pods():  # no pod made at all (not one in the kubelet's back-off): the controller stalled
                self.restart_stalled_controller()
            try:
                pod = until(one, timeout, f"the {self.app} pod Ready", logs, interval=1)
            except WaitFailed:
                self.keep_last_logs()  # a container that failed at start: why, for the report's folder
                raise
        self._pids = []
        self.follow_logs([pod])
        return pod

    def restart_stalled_controller(self) -> None:
        """No pod of the DaemonSet a while after the node's labels or a deletion asked for one: the cluster's
        DaemonSet controller waits on a stale read of its own write (`read version ... is not as new as written
        version`, kube-controller-manager's log), which was seen to last minutes. The soak tests the agent, not the
        controller: it restarts the controller-manager, and says so in the report."""
        self.controller_restarts += 1
        self.cluster.restart_controller_manager()

    def kill(self) -> str:
        """SIGKILL to the container's main process, by the host (containerd's task): the kubelet restarts it. A
        container killed KILLS_BEFORE_BACKOFF times already would wait for its restart behind the kubelet's crash
        back-off (10 s, doubling, up to 5 minutes: a fault of the soak's own making, which holds up the schedule),
        so its pod is deleted instead. What happened, for the report."""
        pod = self.newest()
        if restarts(pod) >= KILLS_BEFORE_BACKOFF:
            self.restart()
            return "its container killed twice already: its pod deleted instead (the kubelet's back-off)"
        killed = container_id(pod)
        how = "its container killed (SIGKILL), restarted by the kubelet"
        try:
            self.cluster.ctr("tasks", "kill", "--signal", "SIGKILL", killed)
        except AssertionError:
            # the pod's status is a look of the past: a rollout may have stopped the container since (containerd:
            # "ttrpc: closed"); nothing is left to kill, and what replaces it is waited for as after a kill
            if self.task_running(killed):
                raise
            how = "its container stopped before the kill reached it (a rollout replaced it)"
        self.starts += 1
        self.wait_settled(other_than=killed)
        return how

    def task_running(self, container: str) -> bool:
        """Whether containerd runs the container's task now."""
        listed = self.cluster.ctr("tasks", "ls", check=False)
        lines = str(getattr(listed, "stdout", "")).splitlines()
        return any(line.split()[:1] == [container] and "RUNNING" in line.split() for line in lines)

    def restart(self) -> None:
        """The pod deleted (its agent stops on SIGTERM), the DaemonSet's new one Ready."""
        pod = self.newest()
        self.cluster.admin.delete("pod", pod["metadata"]["name"], NAMESPACE, wait=False)
        self.starts += 1
        self.wait_settled(other_than=container_id(pod))

    def wait_config_seen(self) -> None:
        wanted = yaml.safe_dump(self.base_config | DEVICE_PLUGIN_CONFIGS[self.config_index], sort_keys=False)

        def seen() -> bool:
            with contextlib.suppress(KubectlError, AssertionError, ValueError):
                for pod in self.pods():
                    name = pod["metadata"]["name"]
                    shown = self.cluster.admin("exec", name, "-n", NAMESPACE, "-c", self.app, "--", "cat", CONFIG)
                    if shown.strip() != wanted.strip():
                        return False
                return True
            return False

        until(seen, 90, "the config in the agent's pod", [], interval=1)

    @property
    def pids(self) -> list[int]:
        """Host PIDs of the agent's containers' main processes (looked up again once one is gone)."""
        if not self._pids or not all(Path(f"/proc/{pid}").exists() for pid in self._pids):
            self._pids = container_mains(PROGRAM)
        return list(self._pids)

    @property
    def pid(self) -> int | None:
        pids = self.pids
        return pids[-1] if pids else None

    def follow_logs(self, pods: list[Obj]) -> None:
        """Each running container's log, followed into the work folder (`<pod>.log`, one after the other when the
        kubelet restarts it) until it ends (a pod deleted in a rollout takes its log with it)."""
        for pod in pods:
            name, running = pod["metadata"]["name"], container_id(pod)
            if not running or f"{name}/{running}" in self.followed:
                continue
            with (self.workdir / f"{name}.log").open("ab") as log:
                command = self.logs_command(name, "-f")
                self.followed[f"{name}/{running}"] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def keep_last_logs(self) -> None:
        """The log of each pod's container that ended last (`kubectl logs --previous`), as `<pod>.previous.log`."""
        for pod in self.pods():
            name = pod["metadata"]["name"]
            with (self.workdir / f"{name}.previous.log").open("ab") as log:
                subprocess.run(self.logs_command(name, "--previous"), stdout=log, stderr=subprocess.STDOUT, timeout=30)

    def logs_command(self, pod: str, *flags: str) -> list[str]:
        admin = self.cluster.admin
        where = ["-n", NAMESPACE, "-c", self.app]
        return [str(admin.binary), "--kubeconfig", str(admin.kubeconfig), "logs", *flags, "--timestamps", pod, *where]

    def stop_following(self) -> None:
        for process in self.followed.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            if process.poll() is None:
                process.terminate()
                process.wait(10)


CONFIG = "/ixconfig/ix-config"
RESET_LOG_VOLUME = "soak-reset-log"


def reset_helper_values(state: Path) -> dict[str, Any]:
    """The chart's reset helper (the container that runs ixsmi beside an unprivileged agent, in either DaemonSet's
    pod) given the stand-in's folder of its reset log and mode, writable at the same path as on the host."""
    return {
        "extraVolumes": [{"name": RESET_LOG_VOLUME, "hostPath": {"path": str(state), "type": "Directory"}}],
        "extraVolumeMounts": [{"name": RESET_LOG_VOLUME, "mountPath": str(state)}],
    }


def ready(pod: Obj) -> bool:
    conditions = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
    return conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def restarts(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return max((int(s.get("restartCount") or 0) for s in statuses), default=0)


def container_id(pod: Obj) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    running = [s for s in statuses if "running" in (s.get("state") or {})]
    return running[0].get("containerID", "").split("://")[-1] if running else ""


def container_mains(program: str, cgroup_root: str = CGROUP_ROOT) -> list[int]:
    """Host PIDs of processes that are the first of their PID namespace (a container's main process), run program
    and are in a cgroup under cgroup_root (this cluster's pods: a cluster beside it, in another slot, runs the
    same program), oldest first."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes()
            cgroups = (entry / "cgroup").read_text()
        except OSError:
            continue
        nspid = re.search(r"^NSpid:\s+(.+)$", status, re.MULTILINE)
        ids = nspid.group(1).split() if nspid else []
        ours = any(line.split(":", 2)[-1].startswith(f"/{cgroup_root}/") for line in cgroups.splitlines())
        if len(ids) > 1 and ids[-1] == "1" and program.encode() in command and ours:
            found.append(int(entry.name))
    return sorted(found)
