"""A one-node Kubernetes cluster of real components, started as host processes and torn down completely.

etcd, kube-apiserver (RBAC and Node authorization, NodeRestriction, the DRA feature gates), the
controller-manager and the scheduler listen on loopback with certificates made for the run; containerd
(CRI, CDI, overlayfs, runc, a bridge CNI network) and a kubelet (cgroupfs driver, its own cgroup root
/ix-e2e) run the node. Every directory the kubelet and containerd use is under the run's work directory:
device-plugin, plugin-registry and plugins directories, the pod-resources socket, the CDI spec directory.
Images come from `images` (imported, never pulled).

`Cluster.stop` kills every process the cluster started (components by process group, containers through
their cgroups, shims by their address), unmounts everything under the work directory, removes the
cgroups, the bridge and the log links, and says what it could not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import images
from .certs import Pki, make_pki
from .kube import Kubectl, kubeconfig_text
from .procs import Process, describe_logs, run, wait_until

NODE_NAME = "ix-e2e-node"
CGROUP_ROOT = "ix-e2e"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
POD_CIDR = "10.244.0.0/24"
BRIDGE = "ixe2e0"
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# The kubelet's device manager serves kubelet.sock at this fixed path whatever --root-dir says
# (pluginapi.KubeletSocket): the cluster bind-mounts its own device-plugin folder here while it runs.
KUBELET_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
# The DRA features the tests use, on explicitly (all are on by default in 1.37; GA ones are locked on).
FEATURE_GATES = {
    "DRAAdminAccess": True,
    "DRADeviceTaints": True,
    "DRAPartitionableDevices": True,
    "DRAConsumableCapacity": True,
    "DRAExtendedResource": True,
    "ResourceHealthStatus": True,
}
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class Binaries:
    """Where build.sh put the components."""

    bin_dir: Path
    cni_bin_dir: Path

    def __getitem__(self, name: str) -> Path:
        return self.bin_dir / name


@dataclass
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kubelet: int
    kubelet_healthz: int


@dataclass
class Cluster:
    """A cluster that `start` brings up and `stop` takes down; the paths below are the node's."""

    binaries: Binaries
    workdir: Path
    logdir: Path
    node_name: str = NODE_NAME
    feature_gates: dict[str, bool] = field(default_factory=lambda: dict(FEATURE_GATES))
    processes: dict[str, Process] = field(default_factory=dict)
    teardown_problems: list[str] = field(default_factory=list)
    bind_mounts: list[Path] = field(default_factory=list)
    created_dirs: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()
        self.node_ip = primary_ip()
        self.ports = Ports(*free_ports(7))
        self.pki_dir = self.workdir / "pki"
        self.kubelet_root = self.workdir / "kubelet"
        self.device_plugin_dir = self.kubelet_root / "device-plugins"
        self.plugins_registry_dir = self.kubelet_root / "plugins_registry"
        self.plugins_dir = self.kubelet_root / "plugins"
        self.pod_resources_socket = self.kubelet_root / "pod-resources" / "kubelet.sock"
        self.cdi_dir = self.workdir / "cdi"
        self.containerd_dir = self.workdir / "containerd"
        self.containerd_socket = self.containerd_dir / "containerd.sock"
        self.cni_conf_dir = self.workdir / "cni" / "net.d"
        self.server = f"https://127.0.0.1:{self.ports.apiserver}"
        self.pki: Pki | None = None
        self.kubectl: Kubectl | None = None

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
        self._make_cgroup_root()
        self._mount_device_plugin_dir()
        self.start_kubelet()
        self.wait_node_ready()
        self._wait_default_service_account()

    def kubeconfig(self, user: str) -> Path:
        return self.pki_dir / f"{user}.kubeconfig"

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

    def _gates(self) -> str:
        return ",".join(f"{name}={'true' if on else 'false'}" for name, on in sorted(self.feature_gates.items()))

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        process = Process(name, argv, self.logdir / f"{name}.log", env=env).start()
        self.processes[name] = process
        return process

    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        client = f"http://127.0.0.1:{self.ports.etcd}"
        etcd = self._spawn(
            "etcd",
            [
                str(self.binaries["etcd"]),
                "--name=ix-e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=ix-e2e={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--listen-metrics-urls=",
                "--quota-backend-bytes=2147483648",
            ],
        )
        wait_until(
            lambda: self._alive(etcd) and b'"health":"true"' in http_get(f"{client}/health"),
            30,
            "etcd healthy",
            [etcd.log],
        )

    def _start_apiserver(self) -> None:
        assert self.pki is not None
        pki = self.pki
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.apiserver}",
                f"--advertise-address={self.node_ip}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.service_account_pub}",
                f"--service-account-signing-key-file={pki.service_account_key}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                f"--kubelet-client-certificate={pki.apiserver_kubelet_client.cert}",
                f"--kubelet-client-key={pki.apiserver_kubelet_client.key}",
                f"--requestheader-client-ca-file={pki.ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
                f"--proxy-client-key-file={pki.front_proxy_client.key}",
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
                "--v=1",
                f"--feature-gates={self._gates()}",
            ],
        )
        kubectl = self.kubectl
        assert kubectl is not None
        wait_until(
            lambda: self._alive(apiserver) and kubectl("get", "--raw", "/readyz", timeout=10).strip() == "ok",
            START_TIMEOUT,
            "kube-apiserver ready",
            [apiserver.log, self.processes["etcd"].log],
            interval=1,
        )

    def _start_controller_manager(self) -> None:
        assert self.pki is not None
        kubeconfig = str(self.kubeconfig("controller-manager"))
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries["kube-controller-manager"]),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.controller_manager}",
                f"--service-account-private-key-file={self.pki.service_account_key}",
                f"--root-ca-file={self.pki.ca.cert}",
                "--use-service-account-credentials=true",
                f"--cluster-signing-cert-file={self.pki.ca.cert}",
                f"--cluster-signing-key-file={self.pki.ca.key}",
                "--leader-elect=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--v=1",
                f"--feature-gates={self._gates()}",
            ],
        )

    def _start_scheduler(self) -> None:
        kubeconfig = str(self.kubeconfig("scheduler"))
        scheduler = self._spawn(
            "kube-scheduler",
            [
                str(self.binaries["kube-scheduler"]),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.scheduler}",
                "--leader-elect=false",
                "--v=2",
                f"--feature-gates={self._gates()}",
            ],
        )
        manager = self.processes["kube-controller-manager"]
        for process, port in ((scheduler, self.ports.scheduler), (manager, self.ports.controller_manager)):
            wait_until(
                lambda process=process, port=port: (
                    self._alive(process) and http_get(f"https://127.0.0.1:{port}/healthz") == b"ok"
                ),
                START_TIMEOUT,
                f"{process.name} healthy",
                [process.log],
                interval=1,
            )

    # ------------------------------------------------------------------ the node

    def containerd_config(self) -> str:
        """containerd's config (version 4): its own root, state and sockets, CDI from cdi_dir, runc, CNI."""
        cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
        runc = f"{cri_runtime}.containerd.runtimes.runc"
        lines = [
            "version = 4",
            "imports = []",
            f'root = "{self.containerd_dir / "root"}"',
            f'state = "{self.containerd_dir / "state"}"',
            "[plugins.'io.containerd.server.v1.grpc']",
            f'  address = "{self.containerd_socket}"',
            "[plugins.'io.containerd.server.v1.ttrpc']",
            f'  address = "{self.containerd_socket}.ttrpc"',
            "[plugins.'io.containerd.cri.v1.images']",
            '  snapshotter = "overlayfs"',
            "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
            f'  sandbox = "{images.PAUSE_IMAGE}"',
            f"[{cri_runtime}]",
            f'  cdi_spec_dirs = ["{self.cdi_dir}"]',
            "  netns_mounts_under_state_dir = true",
            # No container gets a lower oom_score_adj than containerd's own: where the host withholds
            # CAP_SYS_RESOURCE (some VM sandboxes), runc cannot set the sandbox's -998 and no pod starts.
            "  restrict_oom_score_adj = true",
            f"[{cri_runtime}.containerd]",
            '  default_runtime_name = "runc"',
            f"[{runc}]",
            '  runtime_type = "io.containerd.runc.v2"',
            "  disable_pause_image_pull = true",
            f"[{runc}.options]",
            f'  BinaryName = "{self.binaries["runc"]}"',
            f'  Root = "{self.containerd_dir / "runc"}"',
            "  SystemdCgroup = false",
            f"[{cri_runtime}.cni]",
            f'  bin_dirs = ["{self.binaries.cni_bin_dir}"]',
            f'  conf_dir = "{self.cni_conf_dir}"',
        ]
        return "\n".join(lines) + "\n"

    def _start_containerd(self) -> None:
        self.containerd_dir.mkdir(parents=True, exist_ok=True)
        config = self.containerd_dir / "config.toml"
        config.write_text(self.containerd_config())
        env = dict(os.environ, PATH=f"{self.binaries.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        containerd = self._spawn("containerd", [str(self.binaries["containerd"]), f"--config={config}"], env=env)
        wait_until(
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
        network = {
            "cniVersion": "1.0.0",
            "name": "ix-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                }
            ],
        }
        (self.cni_conf_dir / "10-ix-e2e.conflist").write_text(json.dumps(network, indent=2))

    def _make_cgroup_root(self) -> None:
        """/ix-e2e in every cgroup v1 hierarchy (cpuset with its parent's CPUs and memory nodes), or, on a
        cgroup v2 host, in the unified hierarchy with its controllers delegated (not exercised on the v1 VM
        this suite was developed on).
        """
        for mount in cgroup_mounts():
            directory = mount / CGROUP_ROOT
            directory.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (mount / name).exists() and not (directory / name).read_text().strip():
                    (directory / name).write_text((mount / name).read_text())
        unified = Path("/sys/fs/cgroup")
        if unified in unified_mounts():
            directory = unified / CGROUP_ROOT
            directory.mkdir(exist_ok=True)
            controllers = (unified / "cgroup.controllers").read_text().split()
            for parent in (unified, directory):
                with contextlib.suppress(OSError):
                    (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in controllers))

    def _mount_device_plugin_dir(self) -> None:
        """Bind-mount device_plugin_dir on KUBELET_DEVICE_PLUGIN_DIR (refusing where a kubelet uses it)."""
        target = KUBELET_DEVICE_PLUGIN_DIR
        if mounts_under(target):
            raise AssertionError(f"{target} is a mount point already (another kubelet, or a run that crashed)")
        if target.is_dir() and any(target.iterdir()):
            raise AssertionError(
                f"{target} is not empty: is a kubelet running on this host? ({sorted(target.iterdir())})"
            )
        self.created_dirs = [path for path in (target.parent, target) if not path.exists()]
        target.mkdir(parents=True, exist_ok=True)
        run(["mount", "--bind", str(self.device_plugin_dir), str(target)])
        self.bind_mounts.append(target)

    def kubelet_config(self) -> dict[str, object]:
        """The KubeletConfiguration: cgroup v1 allowed, cgroupfs, everything under the work directory."""
        assert self.pki is not None
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # cgroup v1 (this kind of VM has no other): refused by default since 1.35.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.node_ip,
            "port": self.ports.kubelet,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports.kubelet_healthz,
            "tlsCertFile": str(self.pki.kubelet_serving.cert),
            "tlsPrivateKeyFile": str(self.pki.kubelet_serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.pki.ca.cert)},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDomain": "cluster.local",
            "failSwapOn": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "podLogsDir": str(self.workdir / "pod-logs"),
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
            "maxPods": 30,
            "featureGates": dict(self.feature_gates),
        }

    def start_kubelet(self) -> Process:
        """Start (or restart, after stop_kubelet) the kubelet."""
        config = self.workdir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config(), sort_keys=False))
        return self._spawn(
            "kubelet",
            [
                str(self.binaries["kubelet"]),
                f"--config={config}",
                f"--kubeconfig={self.kubeconfig('kubelet')}",
                f"--root-dir={self.kubelet_root}",
                f"--hostname-override={self.node_name}",
                f"--node-ip={self.node_ip}",
                "--v=2",
            ],
        )

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

        return wait_until(ready, timeout, f"node {self.node_name} Ready", self.node_logs(), interval=1)

    def _wait_default_service_account(self) -> None:
        wait_until(
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
            ("pod processes", self._kill_cgroup_processes),
            ("containerd shims", self._kill_shims),
            ("containerd", lambda: self._stop_process("containerd")),
            ("kube-scheduler", lambda: self._stop_process("kube-scheduler")),
            ("kube-controller-manager", lambda: self._stop_process("kube-controller-manager")),
            ("kube-apiserver", lambda: self._stop_process("kube-apiserver")),
            ("etcd", lambda: self._stop_process("etcd")),
            ("mounts", self._unmount_all),
            ("device-plugin directory", self._unmount_device_plugin_dir),
            ("cgroups", self._remove_cgroups),
            ("bridge", self._remove_bridge),
            ("container log links", self._remove_log_links),
        ]
        for name, step in steps:
            try:
                step()
            except Exception as error:
                self.teardown_problems.append(f"{name}: {error!r}")
        leftovers = mounts_under(self.workdir)
        if leftovers:
            self.teardown_problems.append(f"still mounted: {leftovers}")
        return self.teardown_problems

    def _stop_process(self, name: str) -> None:
        process = self.processes.get(name)
        if process is not None:
            process.stop()

    def _kill_cgroup_processes(self) -> None:
        """SIGKILL every process in the cluster's cgroups (the pods' containers and sandboxes)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = cgroup_pids(CGROUP_ROOT)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        raise AssertionError(f"processes left in /{CGROUP_ROOT}: {sorted(cgroup_pids(CGROUP_ROOT))}")

    def _kill_shims(self) -> None:
        """SIGKILL the runc shims this cluster's containerd started (they run outside its process group)."""
        address = str(self.containerd_socket)
        for pid in shim_pids(address):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _unmount_all(self) -> None:
        for attempt in range(5):
            mounts = mounts_under(self.workdir)
            if not mounts:
                return
            for mount in reversed(mounts):
                flag = ["-l"] if attempt >= 2 else []
                run(["umount", *flag, mount], check=False, timeout=30)
        remaining = mounts_under(self.workdir)
        if remaining:
            raise AssertionError(f"could not unmount {remaining}")

    def _unmount_device_plugin_dir(self) -> None:
        for target in self.bind_mounts:
            if mounts_under(target):
                run(["umount", str(target)], check=False, timeout=30)
            if mounts_under(target):
                run(["umount", "-l", str(target)], timeout=30)
        self.bind_mounts.clear()
        for path in reversed(self.created_dirs):
            with contextlib.suppress(OSError):
                path.rmdir()

    def _remove_cgroups(self) -> None:
        for mount in [*cgroup_mounts(), *unified_mounts()]:
            root = mount / CGROUP_ROOT
            if not root.exists():
                continue
            for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
            if root.exists():
                raise AssertionError(f"cgroup {root} could not be removed")

    def _remove_bridge(self) -> None:
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            run(["ip", "link", "delete", BRIDGE], check=False, timeout=30)

    def _remove_log_links(self) -> None:
        if not CONTAINER_LOG_LINKS.is_dir():
            return
        for link in CONTAINER_LOG_LINKS.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(str(self.workdir)):
                link.unlink()

    def remove_workdir(self) -> None:
        """Delete the work directory (after stop; refuses while anything is mounted under it)."""
        if mounts_under(self.workdir):
            raise AssertionError(f"not removing {self.workdir}: still mounted under it")
        shutil.rmtree(self.workdir, ignore_errors=True)


# ---------------------------------------------------------------------- host helpers


def primary_ip() -> str:
    """The address this host reaches the outside with (the kubelet refuses a loopback node IP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("203.0.113.1", 9))  # TEST-NET-3; no packet is sent: connect only picks the route
        return probe.getsockname()[0]


def free_ports(count: int) -> list[int]:
    """count distinct TCP ports free on loopback right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def http_get(url: str, timeout: float = 5) -> bytes:
    """GET url (TLS not verified: the components' self-signed serving certificates)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
        return response.read()


def _mountinfo() -> Iterator[tuple[str, str]]:
    """(mount point, filesystem type) of every mount in this mount namespace, in mount order."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        point = fields[4].encode().decode("unicode_escape")
        yield point, fields[separator + 1]


def bind_source(point: Path) -> str | None:
    """For a mount at point, the path within its filesystem that is mounted there (a bind's source)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4].encode().decode("unicode_escape") == str(point):
            return fields[3].encode().decode("unicode_escape")
    return None


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below directory, in mount order."""
    prefix = str(directory)
    return [point for point, _ in _mountinfo() if point == prefix or point.startswith(prefix + "/")]


def cgroup_mounts() -> list[Path]:
    """The cgroup v1 hierarchies' mount points."""
    return [Path(point) for point, kind in _mountinfo() if kind == "cgroup"]


def unified_mounts() -> list[Path]:
    return [Path(point) for point, kind in _mountinfo() if kind == "cgroup2"]


def cgroup_pids(root: str) -> set[int]:
    """Every process in any cgroup below /root, in any hierarchy."""
    pids: set[int] = set()
    for mount in [*cgroup_mounts(), *unified_mounts()]:
        base = mount / root
        if not base.exists():
            continue
        for procs in base.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids |= {int(pid) for pid in procs.read_text().split()}
    return pids


def shim_pids(containerd_address: str) -> list[int]:
    """containerd-shim-runc-v2 processes serving the containerd at containerd_address."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and containerd_address.encode() in argv:
            found.append(int(entry.name))
    return found
