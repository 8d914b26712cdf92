"""A one-node Kubernetes cluster of real components, started as host processes and torn down completely.

etcd, kube-apiserver (RBAC and Node authorization, NodeRestriction, the DRA feature gates), the
controller-manager and the scheduler run with certificates made for the run; containerd (CRI, CDI,
overlayfs, runc, a bridge CNI network), a kubelet (cgroupfs driver, its own cgroup root /ix-e2e) and
kube-proxy (nftables) run the node. The API server listens on every address and advertises the node's, so
that pods reach it through the `kubernetes` Service (SERVICE_IP) with their own tokens, as in any cluster;
the other components listen on loopback. Every directory the kubelet and containerd use is under the run's
work directory: device-plugin, plugin-registry and plugins directories, the pod-resources socket, the CDI
spec directory. Images come from `images` (imported, never pulled). The components' command lines and
configuration come from `components`; the host's mounts, cgroups and processes are reached through `host`.

`Cluster.stop` kills every process the cluster started (components by process group, containers through
their cgroups, shims by their address), unmounts everything under the work directory, removes the
cgroups, the bridge, kube-proxy's rules and the log links, and says what it could not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import components, host, images, slots
from .certs import Pki, make_pki
from .components import Binaries, Ports, Stack
from .kube import Kubectl, kubeconfig_text
from .procs import Process, describe_logs, run
from .waits import until

NODE_NAME = "ix-e2e-node"
# The kubelet's cgroup root: ix-e2e, or ix-e2e-slot<N> when clusters run side by side (harness/slots.py).
CGROUP_ROOT = slots.cgroup_root(slots.number())
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
POD_CIDR = "10.244.0.0/24"
BRIDGE = "ixe2e0"
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# The kubelet's device manager serves kubelet.sock at this fixed path whatever --root-dir says
# (pluginapi.KubeletSocket): the cluster bind-mounts its own device-plugin folder here while it runs.
KUBELET_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
# The longest kubelet root of a supported distribution (MicroK8s's --root-dir). The cluster's is at least as long,
# so that every scenario shows the agent's sockets fit there: the DRA driver's, which the kubelet dials in its root,
# and the device plugin's, served from the cluster's device-plugin folder (the kubelet dials the bind mount above).
MICROK8S_KUBELET_ROOT = "/var/snap/microk8s/common/var/lib/kubelet"
# The DRA features the tests use, on explicitly (all are on by default in 1.37; GA ones are locked on). An older
# Kubernetes is given those it knows (components.known_gates): 1.29 none.
FEATURE_GATES = {
    "DRAAdminAccess": True,
    "DRADeviceTaints": True,
    "DRAPartitionableDevices": True,
    "DRAConsumableCapacity": True,
    "DRAExtendedResource": True,
    "ResourceHealthStatus": True,
}
START_TIMEOUT = 120.0


def kubelet_root(workdir: Path) -> Path:
    """The kubelet's root directory in workdir: `kubelet`, padded to the length of MICROK8S_KUBELET_ROOT."""
    short = len(MICROK8S_KUBELET_ROOT.encode()) - len(str(workdir / "kubelet").encode())
    return workdir / ("kubelet" + "_" * max(short, 0))


@dataclass
class Cluster:
    """A cluster that `start` brings up and `stop` takes down; the paths below are the node's."""

    binaries: Binaries
    workdir: Path
    logdir: Path
    node_name: str = NODE_NAME
    feature_gates: dict[str, bool] = field(default_factory=lambda: dict(FEATURE_GATES))
    # The releases the binaries are of (the lane's: harness.build.stack); what an older one does not know is left out.
    stack: Stack = components.CURRENT
    processes: dict[str, Process] = field(default_factory=dict)
    teardown_problems: list[str] = field(default_factory=list)
    bind_mounts: list[Path] = field(default_factory=list)
    created_dirs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()
        self.node_ip = host.primary_ip()
        *ports, proxy_healthz, proxy_metrics = host.free_ports(9)
        self.ports = Ports(*ports)
        self.proxy_ports = (proxy_healthz, proxy_metrics)
        self.pki_dir = self.workdir / "pki"
        self.kubelet_root = kubelet_root(self.workdir)
        self.device_plugin_dir = self.kubelet_root / "device-plugins"
        self.plugins_registry_dir = self.kubelet_root / "plugins_registry"
        self.plugins_dir = self.kubelet_root / "plugins"
        self.pod_resources_socket = self.kubelet_root / "pod-resources" / "kubelet.sock"
        self.cdi_dir = self.workdir / "cdi"
        self.containerd_dir = self.workdir / "containerd"
        self.containerd_socket = self.containerd_dir / "containerd.sock"
        self.cni_conf_dir = self.workdir / "cni" / "net.d"
        self.server = f"https://127.0.0.1:{self.ports.apiserver}"
        self.audit_log = self.logdir / "kube-apiserver-audit.log"
        self.pki: Pki | None = None
        self.kubectl: Kubectl | None = None
        # What components.HOST_POD_LOGS held before a kubelet that writes there started (None: it does not, or
        # has not yet); made: the folder was not there.
        self.host_pod_logs_before: set[str] | None = None
        self.host_pod_logs_made = False

    # ------------------------------------------------------------------ start

    def start(self) -> Cluster:
        """Bring everything up and wait until the node is Ready; on failure, tear down and raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        for directory in (self.workdir, self.logdir, self.cdi_dir, self.cni_conf_dir, self.device_plugin_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(self.pki_dir, self.node_name, self.node_ip, SERVICE_IP)
        self._write_kubeconfigs()
        self.kubectl = Kubectl(self.binaries["kubectl"], self.kubeconfig("admin"))
        self._start_etcd()
        self._start_apiserver()
        self._start_controller_manager()
        self._start_scheduler()
        self._start_containerd()
        self.import_image(images.pause_image(self.binaries["pause"]))
        busybox = images.find_static_busybox()
        if busybox is None:
            raise AssertionError("a static busybox is needed for the test image (apt-get install busybox-static)")
        self.import_image(images.busybox_image(busybox))
        self._write_cni_config()
        host.make_cgroup_root(CGROUP_ROOT)
        self._mount_device_plugin_dir()
        if components.pod_logs_on_host(self.stack):
            logs = components.HOST_POD_LOGS
            self.host_pod_logs_made = not logs.exists()
            self.host_pod_logs_before = set() if self.host_pod_logs_made else {p.name for p in logs.iterdir()}
        self.start_kubelet()
        self.wait_node_ready()
        self._start_kube_proxy()
        self._wait_default_service_account()

    def kubeconfig(self, user: str) -> Path:
        return self.pki_dir / f"{user}.kubeconfig"

    def admin_tls(self) -> ssl.SSLContext:
        """A TLS context for the API server as the cluster's admin (for readers that talk HTTPS to it directly)."""
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        context.load_cert_chain(str(self.pki.admin.cert), str(self.pki.admin.key))
        return context

    def _write_kubeconfigs(self) -> None:
        assert self.pki is not None
        users = {
            "admin": self.pki.admin,
            "controller-manager": self.pki.controller_manager,
            "scheduler": self.pki.scheduler,
            "kubelet": self.pki.kubelet_client,
        }
        for user, pair in users.items():
            text = kubeconfig_text(self.server, self.pki.ca.cert, user, pair.cert, pair.key)
            self.kubeconfig(user).write_text(text)

    def _known_gates(self) -> dict[str, bool]:
        return components.known_gates(self.feature_gates, self.stack)

    def _gates(self) -> str:
        return components.feature_gates_flag(self._known_gates())

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        process = Process(name, argv, self.logdir / f"{name}.log", env=env).start()
        self.processes[name] = process
        return process

    def _start_etcd(self) -> None:
        etcd = self._spawn("etcd", components.etcd_argv(self.binaries, self.ports, self.workdir / "etcd"))
        health = f"{components.etcd_client_url(self.ports)}/health"
        until(
            lambda: self._alive(etcd) and b'"health":"true"' in host.http_get(health),
            30,
            "etcd healthy",
            [etcd.log],
        )

    def restart_apiserver(self, timeout: float = 5.0) -> None:
        """Stop the API server (SIGKILL after timeout seconds of SIGTERM) and start it again, ready."""
        self._stop_process("kube-apiserver", timeout)
        self._start_apiserver()

    def _start_apiserver(self) -> None:
        assert self.pki is not None
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(components.audit_policy(), sort_keys=False))
        argv = components.apiserver_argv(
            self.binaries,
            self.ports,
            self.pki,
            self.node_ip,
            SERVICE_CIDR,
            self._gates(),
            bind_address="0.0.0.0",
            audit=(policy, self.audit_log),
            stack=self.stack,
        )
        apiserver = self._spawn("kube-apiserver", argv)
        kubectl = self.kubectl
        assert kubectl is not None
        until(
            lambda: self._alive(apiserver) and kubectl("get", "--raw", "/readyz", timeout=10).strip() == "ok",
            START_TIMEOUT,
            "kube-apiserver ready",
            [apiserver.log, self.processes["etcd"].log],
            interval=1,
        )

    def restart_controller_manager(self) -> None:
        """Stop kube-controller-manager (SIGTERM) and start it again, healthy (it runs without leader election)."""
        self._stop_process("kube-controller-manager")
        self._start_controller_manager()
        manager = self.processes["kube-controller-manager"]
        until(
            lambda: (
                self._alive(manager)
                and host.http_get(f"https://127.0.0.1:{self.ports.controller_manager}/healthz") == b"ok"
            ),
            START_TIMEOUT,
            "kube-controller-manager healthy",
            [manager.log],
            interval=1,
        )

    def _start_controller_manager(self) -> None:
        assert self.pki is not None
        kubeconfig = self.kubeconfig("controller-manager")
        argv = components.controller_manager_argv(
            self.binaries, self.ports, self.pki, kubeconfig, SERVICE_CIDR, self._gates()
        )
        self._spawn("kube-controller-manager", argv)

    def _start_scheduler(self) -> None:
        argv = components.scheduler_argv(self.binaries, self.ports, self.kubeconfig("scheduler"), self._gates())
        scheduler = self._spawn("kube-scheduler", argv)
        manager = self.processes["kube-controller-manager"]
        for process, port in ((scheduler, self.ports.scheduler), (manager, self.ports.controller_manager)):
            until(
                lambda process=process, port=port: (
                    self._alive(process) and host.http_get(f"https://127.0.0.1:{port}/healthz") == b"ok"
                ),
                START_TIMEOUT,
                f"{process.name} healthy",
                [process.log],
                interval=1,
            )

    # ------------------------------------------------------------------ the node

    def _start_containerd(self) -> None:
        self.containerd_dir.mkdir(parents=True, exist_ok=True)
        config = self.containerd_dir / "config.toml"
        config.write_text(
            components.containerd_config(
                self.binaries,
                self.containerd_dir,
                self.containerd_socket,
                self.cdi_dir,
                self.cni_conf_dir,
                self.stack,
            )
        )
        env = dict(os.environ, PATH=f"{self.binaries.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        containerd = self._spawn("containerd", [str(self.binaries["containerd"]), f"--config={config}"], env=env)
        until(
            lambda: self._alive(containerd) and self.ctr("version", check=False).returncode == 0,
            30,
            "containerd serving",
            [containerd.log],
        )

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> object:
        """ctr in the k8s.io namespace (the kubelet's) against this cluster's containerd."""
        argv = [str(self.binaries["ctr"]), "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args]
        return run(argv, timeout=timeout, check=check)

    def import_image(self, archive: bytes, name: str = "image") -> None:
        """Load an OCI or docker archive into containerd (unpacked for overlayfs)."""
        with tempfile.NamedTemporaryFile(dir=self.workdir, suffix=f"-{name}.tar") as file:
            file.write(archive)
            file.flush()
            self.import_image_file(Path(file.name))

    def import_image_file(self, path: Path) -> None:
        self.ctr("images", "import", "--platform", "linux/amd64", str(path), timeout=600)

    def _write_cni_config(self) -> None:
        network = components.cni_config(BRIDGE, POD_CIDR, self.workdir / "cni" / "ipam")
        (self.cni_conf_dir / "10-ix-e2e.conflist").write_text(json.dumps(network, indent=2))

    def _mount_device_plugin_dir(self) -> None:
        """Bind-mount device_plugin_dir on KUBELET_DEVICE_PLUGIN_DIR (refusing where a kubelet uses it)."""
        target = KUBELET_DEVICE_PLUGIN_DIR
        if host.mounts_under(target):
            raise AssertionError(f"{target} is a mount point already (another kubelet, or a run that crashed)")
        if target.is_dir() and any(target.iterdir()):
            raise AssertionError(
                f"{target} is not empty: is a kubelet running on this host? ({sorted(target.iterdir())})"
            )
        self.created_dirs = [path for path in (target.parent, target) if not path.exists()]
        target.mkdir(parents=True, exist_ok=True)
        run(["mount", "--bind", str(self.device_plugin_dir), str(target)])
        self.bind_mounts.append(target)

    def start_kubelet(self) -> Process:
        """Start (or restart, after stop_kubelet) the kubelet."""
        assert self.pki is not None
        settings = components.kubelet_config(
            pki=self.pki,
            ports=self.ports,
            node_ip=self.node_ip,
            containerd_socket=self.containerd_socket,
            cgroup_root=CGROUP_ROOT,
            workdir=self.workdir,
            feature_gates=self._known_gates(),
            stack=self.stack,
        )
        config = self.workdir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        argv = components.kubelet_argv(
            self.binaries, config, self.kubeconfig("kubelet"), self.kubelet_root, self.node_name, self.node_ip
        )
        return self._spawn("kubelet", argv)

    def stop_kubelet(self) -> None:
        kubelet = self.processes.get("kubelet")
        if kubelet is not None:
            kubelet.stop()

    def wait_node_ready(self, timeout: float = START_TIMEOUT) -> dict[str, object]:
        """The Node once Ready and without the not-ready taint."""

        def ready() -> dict[str, object] | None:
            self._alive(self.processes["kubelet"])
            node = self.admin.get_or_none("node", self.node_name)
            if node is None:
                return None
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            taints = [t["key"] for t in node["spec"].get("taints", [])]
            return node if conditions.get("Ready") == "True" and not taints else None

        return until(ready, timeout, f"node {self.node_name} Ready", self.node_logs(), interval=1)

    def _start_kube_proxy(self) -> None:
        """kube-proxy, once the Node it reads its addresses from is there; ready when the `kubernetes` Service answers
        from this host as it will from pods: through the Service's IP, with a certificate naming that IP."""
        assert self.pki is not None
        kubeconfig = self.kubeconfig("kube-proxy")
        pair = self.pki.kube_proxy
        kubeconfig.write_text(kubeconfig_text(self.server, self.pki.ca.cert, "kube-proxy", pair.cert, pair.key))
        healthz, metrics = self.proxy_ports
        argv = components.kube_proxy_argv(
            self.binaries, kubeconfig, self.node_name, POD_CIDR, healthz, metrics, self.stack
        )
        proxy = self._spawn("kube-proxy", argv)
        until(
            lambda: self._alive(proxy) and self.service_readyz() == b"ok",
            START_TIMEOUT,
            f"the kubernetes Service answering on https://{SERVICE_IP} (kube-proxy)",
            [proxy.log],
            interval=1,
        )

    def service_readyz(self) -> bytes | None:
        """The API server's /readyz through the `kubernetes` Service (verified against SERVICE_IP), None when nothing
        answers there yet."""
        try:
            with urllib.request.urlopen(f"https://{SERVICE_IP}/readyz", timeout=5, context=self.admin_tls()) as answer:
                return answer.read()
        except (OSError, urllib.error.URLError):
            return None

    def _clean_service_rules(self) -> None:
        """kube-proxy's rules out of the host's nftables (also those of a run that died: it may never have started)."""
        if self.binaries["kube-proxy"].exists():
            run(components.kube_proxy_cleanup_argv(self.binaries, self.stack), timeout=60)

    def _wait_default_service_account(self) -> None:
        until(
            lambda: self.admin.get_or_none("serviceaccount", "default", "default"),
            60,
            "the default ServiceAccount (controller-manager)",
            [self.processes["kube-controller-manager"].log],
        )

    @property
    def admin(self) -> Kubectl:
        assert self.kubectl is not None, "cluster not started"
        return self.kubectl

    def node_logs(self) -> list[Path]:
        return [self.processes[name].log for name in ("kubelet", "containerd") if name in self.processes]

    def control_plane_logs(self) -> list[Path]:
        names = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
        return [self.processes[name].log for name in names if name in self.processes]

    def all_logs(self) -> list[Path]:
        return [process.log for process in self.processes.values()]

    def _alive(self, process: Process) -> bool:
        process.check_running()
        return True

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path, duration: str = "2h") -> Path:
        """A kubeconfig holding a fresh token (TokenRequest) of the ServiceAccount namespace/name."""
        assert self.pki is not None
        token = self.admin("create", "token", name, "-n", namespace, f"--duration={duration}").strip()
        path.write_text(kubeconfig_text(self.server, self.pki.ca.cert, f"{namespace}-{name}", token=token))
        return path

    def describe(self) -> str:
        """The components' log tails, for a failure message."""
        return describe_logs(self.all_logs())

    # ------------------------------------------------------------------ stop

    def stop(self) -> list[str]:
        """Tear everything down, also after a failed start; returns (and keeps) what could not be cleaned."""
        steps = [
            ("kubelet", self.stop_kubelet),
            ("kube-proxy", lambda: self._stop_process("kube-proxy")),
            ("pod processes", lambda: host.kill_cgroup_processes(CGROUP_ROOT)),
            ("containerd shims", lambda: host.kill_shims(str(self.containerd_socket))),
            ("containerd", lambda: self._stop_process("containerd")),
            ("kube-scheduler", lambda: self._stop_process("kube-scheduler")),
            ("kube-controller-manager", lambda: self._stop_process("kube-controller-manager")),
            ("kube-apiserver", lambda: self._stop_process("kube-apiserver")),
            ("etcd", lambda: self._stop_process("etcd")),
            ("mounts", lambda: host.unmount_all(self.workdir)),
            ("device-plugin directory", self._unmount_device_plugin_dir),
            ("cgroups", lambda: host.remove_cgroup_root(CGROUP_ROOT)),
            ("bridge", lambda: host.delete_link(BRIDGE)),
            ("kube-proxy's rules", self._clean_service_rules),
            ("container log links", lambda: host.remove_links_into(CONTAINER_LOG_LINKS, self.workdir)),
            ("pod log folders", self._remove_host_pod_logs),
        ]
        for name, step in steps:
            try:
                step()
            except Exception as error:
                self.teardown_problems.append(f"{name}: {error!r}")
        leftovers = host.mounts_under(self.workdir)
        if leftovers:
            self.teardown_problems.append(f"still mounted: {leftovers}")
        return self.teardown_problems

    def _remove_host_pod_logs(self) -> None:
        """The pod log folders this run's kubelet made in components.HOST_POD_LOGS (one without podLogsDir), and the
        folder itself where the run made it."""
        logs = components.HOST_POD_LOGS
        if self.host_pod_logs_before is None or not logs.is_dir():
            return
        if self.host_pod_logs_made:
            shutil.rmtree(logs)
            return
        for entry in logs.iterdir():
            if entry.name not in self.host_pod_logs_before:
                shutil.rmtree(entry)

    def _stop_process(self, name: str, timeout: float = 15.0) -> None:
        process = self.processes.get(name)
        if process is not None:
            process.stop(timeout)

    def _unmount_device_plugin_dir(self) -> None:
        for target in self.bind_mounts:
            host.unmount(target)
        self.bind_mounts.clear()
        for path in reversed(self.created_dirs):
            with contextlib.suppress(OSError):
                path.rmdir()

    def remove_workdir(self) -> None:
        """Delete the work directory (after stop; refuses while anything is mounted under it)."""
        if host.mounts_under(self.workdir):
            raise AssertionError(f"not removing {self.workdir}: still mounted under it")
        # A process that has just been stopped may still remove its own socket or log meanwhile, which
        # makes the last rmdir fail: try again for a few seconds, and say it when something stays.
        for _ in range(10):
            shutil.rmtree(self.workdir, ignore_errors=True)
            if not self.workdir.exists():
                return
            time.sleep(0.3)
        left = sorted(str(path) for path in self.workdir.rglob("*"))[:5]
        sys.stderr.write(f"\ne2e: could not remove {self.workdir} (still in it: {left})\n")
