"""Kueue as the quota scenarios run it: its manager (sigs.k8s.io/kueue, the release e2e/versions.env pins) as a host
process against the cluster's API server, with its CRDs and the configuration docs/quota.md documents; and the
queues, Jobs and Workloads the scenarios make and read.

No webhook is registered with the API server: a Job is created suspended and with the queue label, as Kueue's
webhook would leave it. internalCertManagement is off, so Kueue gets its certificates from files: its webhook server
(it starts one whatever is registered) serves a self-signed certificate from the run's folder, and its metrics server
reads the one path it hard-codes, /etc/kueue/metrics/certs, which the manager sees bind-mounted from the run's folder
in a mount namespace of its own: the host's /etc/kueue is left as it is (made empty where missing, removed after).
The manager talks to the API server with a client certificate of its own (system:masters, not the admin's: the audit
log records the admin's requests). Its log is kueue.log in the run's log folder.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from ix_device_plugin.core.labels import PRODUCT

from . import host
from .certs import make_leaf
from .cluster import Cluster
from .dra import DRIVER
from .kube import Kubectl, Obj, kubeconfig_text
from .procs import Process
from .waits import until

API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The quota resources of docs/quota.md: chips and boards in chips (the `chips` counter every non-shared device
# consumes), shares (the `shares` capacity of a shared chip), and `iluvatar.com/gpu` through DRA, in its units.
CHIPS = "iluvatar.com/chips"
SHARES = "iluvatar.com/shares"
GPU = "iluvatar.com/gpu"
CHIP_CLASS = DRIVER
BOARD_CLASS = f"board.{DRIVER}"
SHARE_CLASS = f"share.{DRIVER}"
EXTENDED_CLASS = f"extended-resource.{DRIVER}"
# Capacity sources are alpha in Kueue 0.19. The visibility server is off: it would listen on every address, port
# 8082, with certificates it writes to /visibility.
FEATURE_GATES = {"KueueDRAIntegrationConsumableCapacity": True, "VisibilityOnDemand": False}
# The ResourceFlavor of docs/quota.md: the node's GPU model, keyed on the label both modes write (core/labels.py).
FLAVOR = "bi-v150"
FLAVOR_LABELS = {PRODUCT: "BI-V150"}
# Kueue's hard-coded folder of the metrics server's certificate (cmd/kueue/main.go), relative to /etc/kueue.
ETC = Path("/etc/kueue")
METRICS_CERTS = Path("metrics/certs")
START_TIMEOUT = 120.0
CRD_NAME = re.compile(r"^  name: (\S+\.kueue\.x-k8s\.io)$", re.MULTILINE)  # each CRD's metadata.name
# Runs the manager with the run's folder on /etc/kueue, in a mount namespace of its own ($1: the folder).
MOUNT_AND_RUN = 'mount --bind "$1" /etc/kueue && shift && exec "$@"'


def all_devices(driver: str = DRIVER) -> dict[str, Any]:
    """A deviceSelector for every device of driver (the pool a counter or capacity source reads)."""
    return {"cel": {"expression": f'device.driver == "{driver}"'}}


def device_class_mappings() -> list[Obj]:
    """Kueue's resources.deviceClassMappings for our DeviceClasses (docs/quota.md)."""
    counter = {"counter": {"name": "chips", "driver": DRIVER, "deviceSelector": all_devices()}}
    capacity = {"capacity": {"name": "shares", "driver": DRIVER, "deviceSelector": all_devices()}}
    return [
        {"name": CHIPS, "deviceClassNames": [CHIP_CLASS, BOARD_CLASS], "sources": [counter]},
        {"name": SHARES, "deviceClassNames": [SHARE_CLASS], "sources": [capacity]},
        {"name": GPU, "deviceClassNames": [EXTENDED_CLASS]},
    ]


def configuration(health_port: int, metrics_port: int, webhook_port: int, webhook_certs: Path) -> Obj:
    """Kueue's Configuration: the batch/Job integration only, no leader election, no internal certificates, its
    servers on loopback, the DRA mappings and FEATURE_GATES."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(webhook_certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": dict(FEATURE_GATES),
        "resources": {"deviceClassMappings": device_class_mappings()},
    }


def crds_file(cluster: Cluster) -> Path:
    """The CRDs build.sh took from the Kueue module, beside the binaries."""
    return cluster.binaries.bin_dir.parent / "kueue" / "kueue-crds.yaml"


class Kueue:
    """The Kueue manager of one run: `start` applies its CRDs and starts it until ready; `stop` stops it, deletes the
    CRDs (and so whatever Kueue objects are left) and removes what it made on the host."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster, self.workdir = cluster, workdir
        self.health_port, self.metrics_port, self.webhook_port = host.free_ports(3)
        self.process: Process | None = None
        self.made_etc = False

    @property
    def log(self) -> Path:
        return self.cluster.logdir / "kueue.log"

    def start(self) -> Kueue:
        """Ready (its /readyz: caches synced, webhook server serving); on failure, stopped and raised."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._apply_crds()
        kubeconfig = self._client_kubeconfig()
        webhook_certs, etc = self._serving_certs()
        config = self.workdir / "kueue-config.yaml"
        settings = configuration(self.health_port, self.metrics_port, self.webhook_port, webhook_certs)
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        if not ETC.exists():
            ETC.mkdir(parents=True)
            self.made_etc = True
        kueue = str(self.cluster.binaries["kueue"])
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", MOUNT_AND_RUN, "kueue"]
        argv += [str(etc), kueue, f"--config={config}"]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "KUBECONFIG": str(kubeconfig)}
        self.process = Process("kueue", argv, self.log, env=env).start()
        process = self.process
        until(
            lambda: process.check_running() or host.http_get(f"http://127.0.0.1:{self.health_port}/readyz") == b"ok",
            START_TIMEOUT,
            "Kueue ready",
            [self.log],
            interval=1,
        )

    def _apply_crds(self) -> None:
        path = crds_file(self.cluster)
        admin = self.cluster.admin
        admin("apply", "--server-side", "--force-conflicts", "--field-manager=ix-e2e", "-f", str(path), timeout=120)
        names = CRD_NAME.findall(path.read_text())  # not parsed: 1.6 MB of YAML takes pure-Python PyYAML seconds

        def established() -> bool:
            crds = {c["metadata"]["name"]: c for c in admin.items("customresourcedefinitions")}
            return all(_condition(crds.get(name) or {}, "Established") == "True" for name in names)

        until(established, 60, "Kueue's CRDs established", self.cluster.control_plane_logs())

    def _client_kubeconfig(self) -> Path:
        pki = self.cluster.pki
        assert pki is not None, "cluster not started"
        pair = make_leaf(pki.ca, self.workdir, "kueue-client", "/O=system:masters/CN=ix-e2e-kueue")
        path = self.workdir / "kueue.kubeconfig"
        path.write_text(kubeconfig_text(self.cluster.server, pki.ca.cert, "kueue", pair.cert, pair.key))
        return path

    def _serving_certs(self) -> tuple[Path, Path]:
        """The webhook server's folder and the folder mounted on /etc/kueue, each with tls.crt and tls.key."""
        webhook = self.workdir / "webhook-certs"
        webhook.mkdir(exist_ok=True)
        pair = make_leaf(None, webhook, "tls", "/CN=ix-e2e-kueue", ["127.0.0.1", "localhost"])
        etc = self.workdir / "etc-kueue"
        metrics = etc / METRICS_CERTS
        metrics.mkdir(parents=True, exist_ok=True)
        for file in (pair.cert, pair.key):
            shutil.copy(file, metrics / file.name)
        return webhook, etc

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        with contextlib.suppress(AssertionError):
            self.cluster.admin("delete", "-f", str(crds_file(self.cluster)), "--ignore-not-found", "--wait=false")
        if self.made_etc:
            with contextlib.suppress(OSError):
                ETC.rmdir()
            self.made_etc = False


def _condition(obj: Obj, kind: str) -> str | None:
    """The status ("True", "False", ...) of obj's condition kind, None without one."""
    return (condition(obj, kind) or {}).get("status")


def condition(obj: Obj, kind: str) -> Obj | None:
    """obj's status condition of type kind, None without one."""
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return found
    return None


# ---------------------------------------------------------------------- queues, Jobs and Workloads


def resource_flavor(name: str = FLAVOR, node_labels: dict[str, str] | None = None) -> Obj:
    """A ResourceFlavor: the nodes of node_labels (FLAVOR_LABELS by default), which Kueue gives admitted pods."""
    labels = FLAVOR_LABELS if node_labels is None else node_labels
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": {"nodeLabels": labels}}


def cluster_queue(name: str, quotas: dict[str, int], flavor: str = FLAVOR) -> Obj:
    """A ClusterQueue for every namespace with a nominal quota of each resource, in one flavor."""
    resources = [{"name": resource, "nominalQuota": str(quota)} for resource, quota in quotas.items()]
    group = {"coveredResources": list(quotas), "flavors": [{"name": flavor, "resources": resources}]}
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": {}, "resourceGroups": [group]},
    }


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> Obj:
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def suspended_job(name: str, queue: str, pod_spec: Obj) -> Obj:
    """A Job of one pod for the LocalQueue queue, created suspended (Kueue starts it once admitted)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": pod_spec}},
    }


def workload_of(admin: Kubectl, namespace: str, job: str) -> Obj | None:
    """The Workload Kueue made for the Job (the one it owns), None before it did."""
    for workload in admin.items("workloads.kueue.x-k8s.io", namespace):
        owners = workload["metadata"].get("ownerReferences") or []
        if any(owner["kind"] == "Job" and owner["name"] == job for owner in owners):
            return workload
    return None


def resource_usage(workload: Obj) -> dict[str, str]:
    """What the admission charged the Workload's pod sets (a Job has one): resource -> quantity as Kueue wrote it."""
    usage: dict[str, str] = {}
    for assignment in workload["status"]["admission"]["podSetAssignments"]:
        usage.update(assignment.get("resourceUsage") or {})
    return usage
