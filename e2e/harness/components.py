"""The cluster's components as they are run: etcd, kube-apiserver, kube-controller-manager and kube-scheduler
command lines, containerd's configuration, the kubelet's configuration and command line, kube-proxy's command line
and the bridge CNI network.

Every function here only builds text or data from what it is given (the built binaries, the ports, the
certificates, the paths, the feature gates, the releases they are of: `Stack`); starting the processes and writing
the files is the cluster's. What an older release does not know is left out for it (a lane of e2e/lanes/ runs
Kubernetes 1.29 and containerd 1.7); the default lane's command lines and files are those of `CURRENT`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import images
from .certs import Pki

# The beta versions of resource.k8s.io that Kubernetes 1.37 still serves, off by default there
# (pkg/controlplane/instance.go betaAPIGroupVersionsDisabledByDefault): on, so that the agents' admission policies
# are checked at every version a real cluster may serve. v1alpha3 has no ResourceSlices in 1.37
# (pkg/registry/resource/rest/storage_resource.go v1alpha3Storage: devicetaintrules, resourcepoolstatusrequests).
RUNTIME_CONFIG = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
# The Kubernetes release that first serves each of them (1.29 serves neither: only v1alpha2, with other types).
RESOURCE_BETA_SINCE = {"resource.k8s.io/v1beta1": (1, 32), "resource.k8s.io/v1beta2": (1, 33)}
# The Kubernetes release that first knows each feature gate the suite sets (pkg/features/kube_features.go): a
# component refuses a gate it does not know, so an older one is not given it.
FEATURE_GATE_SINCE = {
    "ResourceHealthStatus": (1, 31),
    "DRAAdminAccess": (1, 32),
    "DRADeviceTaints": (1, 33),
    "DRAPartitionableDevices": (1, 33),
    "DRAConsumableCapacity": (1, 34),
    "DRAExtendedResource": (1, 34),
}
# KubeletConfiguration fields and the release that first knows them (k8s.io/kubelet config/v1beta1): the kubelet
# refuses a configuration file with a field it does not know.
KUBELET_FIELD_SINCE = {"podLogsDir": (1, 30), "failCgroupV1": (1, 31)}
# Where a kubelet without podLogsDir writes the pods' logs: the host's, not the run's.
HOST_POD_LOGS = Path("/var/log/pods")
# kube-proxy's nftables mode: alpha behind NFTablesProxyMode in 1.29 and 1.30, on by default from 1.31.
NFTABLES_DEFAULT_SINCE = (1, 31)


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version such as v1.29.6 or 2.4.2."""
    major, minor, *_ = version.removeprefix("v").split(".")
    return int(major), int(minor)


@dataclass(frozen=True)
class Stack:
    """The releases the cluster runs, (major, minor) each, and whether containerd serves NRI: what the command lines
    and configuration files depend on."""

    kubernetes: tuple[int, int]
    containerd: tuple[int, int]
    nri: bool = True

    @classmethod
    def of(cls, versions: Mapping[str, str]) -> Stack:
        """The stack of e2e/versions.env's lines (a lane's over them): KUBERNETES_VERSION, CONTAINERD_VERSION and
        CONTAINERD_NRI (on, the default, or off)."""
        nri = versions.get("CONTAINERD_NRI", "on")
        if nri not in ("on", "off"):
            raise ValueError(f"CONTAINERD_NRI is on or off, not {nri!r}")
        return cls(release(versions["KUBERNETES_VERSION"]), release(versions["CONTAINERD_VERSION"]), nri == "on")

    def knows(self, since: tuple[int, int] | None) -> bool:
        """Whether this Kubernetes is release `since` or later (None: any)."""
        return since is None or self.kubernetes >= since


# The default lane's stack (e2e/versions.env; a unit test keeps them together).
CURRENT = Stack(kubernetes=(1, 37), containerd=(2, 4), nri=True)


def pod_logs_on_host(stack: Stack) -> bool:
    """Whether stack's kubelet writes the pods' logs to HOST_POD_LOGS (it has no podLogsDir)."""
    return not stack.knows(KUBELET_FIELD_SINCE["podLogsDir"])


def known_gates(gates: Mapping[str, bool], stack: Stack) -> dict[str, bool]:
    """The gates of `gates` that stack's Kubernetes knows (a gate not in FEATURE_GATE_SINCE is taken as known)."""
    return {name: on for name, on in gates.items() if stack.knows(FEATURE_GATE_SINCE.get(name))}


def runtime_config(stack: Stack) -> str:
    """The value of kube-apiserver's --runtime-config: the beta versions of resource.k8s.io stack serves, on."""
    served = [group for group, since in RESOURCE_BETA_SINCE.items() if stack.knows(since)]
    return ",".join(f"{group}=true" for group in served)


@dataclass(frozen=True)
class Binaries:
    """Where build.sh put the components."""

    bin_dir: Path
    cni_bin_dir: Path

    def __getitem__(self, name: str) -> Path:
        return self.bin_dir / name


@dataclass
class Ports:
    """The loopback (and, for the kubelet, node) ports the components listen on."""

    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kubelet: int
    kubelet_healthz: int


def feature_gates_flag(gates: Mapping[str, bool]) -> str:
    """The value of a component's --feature-gates: name=true|false, sorted by name."""
    return ",".join(f"{name}={'true' if on else 'false'}" for name, on in sorted(gates.items()))


def gates_flags(feature_gates: str) -> list[str]:
    """--feature-gates=feature_gates, or nothing where there are none."""
    return [f"--feature-gates={feature_gates}"] if feature_gates else []


# ---------------------------------------------------------------------- control plane


def etcd_client_url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.etcd}"


def etcd_argv(binaries: Binaries, ports: Ports, data_dir: Path) -> list[str]:
    """A single-member etcd on loopback, without fsync (its data is thrown away with the run)."""
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    client = etcd_client_url(ports)
    return [
        str(binaries["etcd"]),
        "--name=ix-e2e",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=ix-e2e={peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
        "--listen-metrics-urls=",
        "--quota-backend-bytes=2147483648",
    ]


def apiserver_argv(
    binaries: Binaries,
    ports: Ports,
    pki: Pki,
    node_ip: str,
    service_cidr: str,
    feature_gates: str,
    bind_address: str = "127.0.0.1",
    audit: tuple[Path, Path] | None = None,
    stack: Stack = CURRENT,
) -> list[str]:
    """kube-apiserver on bind_address (loopback by default): client certificates, Node and RBAC authorization,
    NodeRestriction, the beta versions of resource.k8s.io served. It advertises node_ip: the `kubernetes` Service's
    endpoint, which pods reach through kube-proxy only where bind_address covers node_ip. audit: (policy file, log
    file) of an audit log (JSON lines), for counting a client's requests from the server's side. feature_gates may
    be empty (no --feature-gates), and so may stack's runtime_config (no --runtime-config)."""
    audit_flags = [] if audit is None else [f"--audit-policy-file={audit[0]}", f"--audit-log-path={audit[1]}"]
    served = runtime_config(stack)
    return [
        str(binaries["kube-apiserver"]),
        f"--etcd-servers={etcd_client_url(ports)}",
        f"--bind-address={bind_address}",
        f"--secure-port={ports.apiserver}",
        f"--advertise-address={node_ip}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-cluster-ip-range={service_cidr}",
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
        *gates_flags(feature_gates),
        *([f"--runtime-config={served}"] if served else []),
        *audit_flags,
    ]


# Whose requests the API server's audit log records (Metadata level: who, what, when; no bodies): the agent's
# ServiceAccounts, as the chart runs it, and the cluster's admin, whose certificate host-process agents may use (the
# soak tells those apart by user agent). Everyone else's requests are not logged.
AUDITED_USERS = (
    "system:serviceaccount:kube-system:iluvatar-device-plugin",
    "system:serviceaccount:kube-system:iluvatar-dra-driver",
    "ix-e2e-admin",  # harness/certs.py: the admin certificate's CN
)


def audit_policy() -> dict[str, object]:
    """An audit policy: one event per request of AUDITED_USERS (at its end, or a watch's), nothing of the rest."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [{"level": "Metadata", "users": list(AUDITED_USERS)}, {"level": "None"}],
    }


def controller_manager_argv(
    binaries: Binaries, ports: Ports, pki: Pki, kubeconfig: Path, service_cidr: str, feature_gates: str
) -> list[str]:
    """kube-controller-manager on loopback, signing with the cluster's CA, without leader election."""
    return [
        str(binaries["kube-controller-manager"]),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca.cert}",
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        "--leader-elect=false",
        f"--service-cluster-ip-range={service_cidr}",
        "--v=1",
        *gates_flags(feature_gates),
    ]


def scheduler_argv(binaries: Binaries, ports: Ports, kubeconfig: Path, feature_gates: str) -> list[str]:
    """kube-scheduler on loopback, without leader election."""
    return [
        str(binaries["kube-scheduler"]),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        "--leader-elect=false",
        "--v=2",
        *gates_flags(feature_gates),
    ]


# ---------------------------------------------------------------------- the node

# nftables rather than iptables: kube-proxy keeps every rule in tables of its own (ip and ip6 "kube-proxy"), so the
# host's other rules are untouched and `kube-proxy --cleanup` removes all of it; it needs the nft command (Debian's
# nftables) and a kernel of 5.13 or later with nf_tables' NAT, conntrack and numgen.
PROXY_MODE = "nftables"


def nftables_gate(stack: Stack) -> list[str]:
    """The feature gate an older kube-proxy needs for its nftables mode, or nothing."""
    return [] if stack.knows(NFTABLES_DEFAULT_SINCE) else ["--feature-gates=NFTablesProxyMode=true"]


def kube_proxy_argv(
    binaries: Binaries,
    kubeconfig: Path,
    node_name: str,
    cluster_cidr: str,
    healthz_port: int,
    metrics_port: int,
    stack: Stack = CURRENT,
) -> list[str]:
    """kube-proxy, the node's service network, on loopback; the host's conntrack settings left as they are."""
    return [
        str(binaries["kube-proxy"]),
        f"--kubeconfig={kubeconfig}",
        f"--proxy-mode={PROXY_MODE}",
        f"--hostname-override={node_name}",
        f"--cluster-cidr={cluster_cidr}",
        f"--healthz-bind-address=127.0.0.1:{healthz_port}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--v=2",
        *nftables_gate(stack),
    ]


def kube_proxy_cleanup_argv(binaries: Binaries, stack: Stack = CURRENT) -> list[str]:
    """kube-proxy removing every rule it made, in any mode. Before 1.31 `kube-proxy --cleanup` also tears down IPVS
    sets with the ipset command and fails where there is none: there nft deletes the tables of the nftables mode,
    the only one the cluster runs (each added first, so that a table kube-proxy never made is no error)."""
    if not stack.knows(NFTABLES_DEFAULT_SINCE):
        return ["nft", "; ".join(f"add table {f} kube-proxy; delete table {f} kube-proxy" for f in ("ip", "ip6"))]
    return [str(binaries["kube-proxy"]), "--cleanup", f"--proxy-mode={PROXY_MODE}"]


NRI_SOCKET = "/var/run/nri/nri.sock"


def containerd_config(
    binaries: Binaries, containerd_dir: Path, socket: Path, cdi_dir: Path, cni_conf_dir: Path, stack: Stack = CURRENT
) -> str:
    """containerd's config: its own root, state and sockets, CDI from cdi_dir, runc, CNI, NRI on or off as stack
    says (version 4 for containerd 2.x, version 2 for 1.x)."""
    if stack.containerd < (2, 0):
        return containerd_1_config(binaries, containerd_dir, socket, cdi_dir, cni_conf_dir, stack.nri)
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    runc = f"{cri_runtime}.containerd.runtimes.runc"
    lines = [
        "version = 4",
        "imports = []",
        f'root = "{containerd_dir / "root"}"',
        f'state = "{containerd_dir / "state"}"',
        "[plugins.'io.containerd.server.v1.grpc']",
        f'  address = "{socket}"',
        "[plugins.'io.containerd.server.v1.ttrpc']",
        f'  address = "{socket}.ttrpc"',
        "[plugins.'io.containerd.cri.v1.images']",
        '  snapshotter = "overlayfs"',
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f'  sandbox = "{images.PAUSE_IMAGE}"',
        f"[{cri_runtime}]",
        f'  cdi_spec_dirs = ["{cdi_dir}"]',
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
        f'  BinaryName = "{binaries["runc"]}"',
        f'  Root = "{containerd_dir / "runc"}"',
        "  SystemdCgroup = false",
        f"[{cri_runtime}.cni]",
        f'  bin_dirs = ["{binaries.cni_bin_dir}"]',
        f'  conf_dir = "{cni_conf_dir}"',
        # NRI as containerd 2.x ships it (on, at its default socket): the chart's injector sidecar registers there.
        "[plugins.'io.containerd.nri.v1.nri']",
        f"  disable = {'false' if stack.nri else 'true'}",
        f'  socket_path = "{NRI_SOCKET}"',
    ]
    return "\n".join(lines) + "\n"


def containerd_1_config(
    binaries: Binaries, containerd_dir: Path, socket: Path, cdi_dir: Path, cni_conf_dir: Path, nri: bool
) -> str:
    """containerd 1.7's config (version 2, pkg/cri/config): what containerd_config says for 2.x, in 1.7's names.
    NRI is off unless nri (1.7 ships it off); CDI is off unless enabled; the opt plugin's folder (1.7 makes it and
    puts its bin/ on PATH) is the run's, not /opt/containerd."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runc = f"{cri}.containerd.runtimes.runc"
    lines = [
        "version = 2",
        f'root = "{containerd_dir / "root"}"',
        f'state = "{containerd_dir / "state"}"',
        "[grpc]",
        f'  address = "{socket}"',
        "[ttrpc]",
        f'  address = "{socket}.ttrpc"',
        '[plugins."io.containerd.internal.v1.opt"]',
        f'  path = "{containerd_dir / "opt"}"',
        f"[{cri}]",
        f'  sandbox_image = "{images.PAUSE_IMAGE}"',
        "  enable_cdi = true",
        f'  cdi_spec_dirs = ["{cdi_dir}"]',
        "  netns_mounts_under_state_dir = true",
        "  restrict_oom_score_adj = true",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{runc}]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{runc}.options]",
        f'  BinaryName = "{binaries["runc"]}"',
        f'  Root = "{containerd_dir / "runc"}"',
        "  SystemdCgroup = false",
        f"[{cri}.cni]",
        f'  bin_dir = "{binaries.cni_bin_dir}"',
        f'  conf_dir = "{cni_conf_dir}"',
        '[plugins."io.containerd.nri.v1.nri"]',
        f"  disable = {'false' if nri else 'true'}",
        f'  socket_path = "{NRI_SOCKET}"',
    ]
    return "\n".join(lines) + "\n"


def cni_config(bridge: str, pod_cidr: str, ipam_dir: Path) -> dict[str, object]:
    """The pod network: a bridge CNI network with host-local addresses from pod_cidr."""
    return {
        "cniVersion": "1.0.0",
        "name": "ix-e2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def kubelet_config(
    *,
    pki: Pki,
    ports: Ports,
    node_ip: str,
    containerd_socket: Path,
    cgroup_root: str,
    workdir: Path,
    feature_gates: Mapping[str, bool],
    stack: Stack = CURRENT,
) -> dict[str, object]:
    """The KubeletConfiguration: cgroup v1 allowed, cgroupfs, everything under the work directory (pod logs under
    /var/log/pods where the kubelet has no podLogsDir yet); the fields stack's kubelet does not know left out."""
    settings: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 (this kind of VM has no other): refused by default since 1.35.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup_root}",
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        "address": node_ip,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "tlsCertFile": str(pki.kubelet_serving.cert),
        "tlsPrivateKeyFile": str(pki.kubelet_serving.key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca.cert)},
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
        "podLogsDir": str(workdir / "pod-logs"),
        "volumePluginDir": str(workdir / "volume-plugins"),
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "5s",
        "maxPods": 30,
        "featureGates": dict(feature_gates),
    }
    for name, since in KUBELET_FIELD_SINCE.items():
        if not stack.knows(since):
            del settings[name]
    return settings


def kubelet_argv(
    binaries: Binaries, config: Path, kubeconfig: Path, root_dir: Path, node_name: str, node_ip: str
) -> list[str]:
    """The kubelet with its configuration file, node identity and root directory."""
    return [
        str(binaries["kubelet"]),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={root_dir}",
        f"--hostname-override={node_name}",
        f"--node-ip={node_ip}",
        "--v=2",
    ]
