"""The real control plane of the fleet bench: etcd, kube-apiserver, kube-controller-manager and kube-scheduler
from the end-to-end build, on loopback, with no kubelet.

Each hollow node's agent has its own identity: a bearer token of the API server's token file, user
`ix-fleet-agent-<i>` in the group AGENTS, bound to the chart's ClusterRoles. The audit log records every request
of that group (metadata only), which is how the bench attributes API server traffic to our agents. The node
lifecycle controller is off: hollow nodes send no heartbeats, and it would taint them unreachable.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from e2e.harness import components, host
from e2e.harness.build import built_binaries
from e2e.harness.certs import Pki, make_pki
from e2e.harness.cluster import FEATURE_GATES, SERVICE_CIDR, SERVICE_IP
from e2e.harness.components import Binaries, Ports
from e2e.harness.kube import Kubectl, kubeconfig_text
from e2e.harness.procs import Process
from e2e.harness.waits import until

AGENTS = "ix-fleet:agents"
# The scheduler's and controller-manager's own client rate limits (50 and 20 requests per second by default)
# raised as the scheduler's performance tests raise them, so that what is measured is the scheduler placing
# pods on our slices, not its client's token bucket (a pod costs it a claim status write and a binding).
CLIENT_RATE = ("--kube-api-qps=1000", "--kube-api-burst=2000")
START_TIMEOUT = 120.0
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "userGroups": [AGENTS]}, {"level": "None"}],
}


class PlaneUnavailable(RuntimeError):
    """The end-to-end build is missing or incomplete; the message says what to run."""


@dataclass(frozen=True)
class AgentIdentity:
    """One agent's user and the file holding its bearer token."""

    user: str
    token_file: Path


@dataclass
class ControlPlane:
    """etcd, kube-apiserver, controller-manager and scheduler; `start`, `restart_apiserver`, `stop`."""

    binaries: Binaries
    workdir: Path
    agents: int
    feature_gates: dict[str, bool] = field(default_factory=lambda: dict(FEATURE_GATES))
    processes: dict[str, Process] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ports = Ports(*host.free_ports(7))
        self.node_ip = host.primary_ip()  # the API server refuses to advertise a loopback address
        self.server = f"https://127.0.0.1:{self.ports.apiserver}"
        self.logdir = self.workdir / "logs"
        self.audit_log = self.workdir / "audit.log"
        self.pki: Pki | None = None
        self.identities: list[AgentIdentity] = []

    @property
    def ca(self) -> Path:
        assert self.pki is not None
        return self.pki.ca.cert

    @property
    def admin(self) -> Kubectl:
        return Kubectl(self.binaries["kubectl"], self.kubeconfig("admin"))

    def kubeconfig(self, user: str) -> Path:
        return self.workdir / f"{user}.kubeconfig"

    def start(self) -> ControlPlane:
        """Bring the control plane up; on failure, take it down and raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(self.workdir / "pki", "ix-fleet-node", self.node_ip, SERVICE_IP)
        for user, pair in {
            "admin": self.pki.admin,
            "controller-manager": self.pki.controller_manager,
            "scheduler": self.pki.scheduler,
        }.items():
            self.kubeconfig(user).write_text(kubeconfig_text(self.server, self.pki.ca.cert, user, pair.cert, pair.key))
        self._write_tokens()
        (self.workdir / "audit-policy.json").write_text(json.dumps(AUDIT_POLICY))
        self._start_etcd()
        self.start_apiserver()
        gates = components.feature_gates_flag(self.feature_gates)
        manager = components.controller_manager_argv(
            self.binaries, self.ports, self.pki, self.kubeconfig("controller-manager"), SERVICE_CIDR, gates
        )
        self._spawn("kube-controller-manager", [*manager, "--controllers=*,-node-lifecycle-controller", *CLIENT_RATE])
        scheduler = components.scheduler_argv(self.binaries, self.ports, self.kubeconfig("scheduler"), gates)
        self._spawn("kube-scheduler", [*scheduler, *CLIENT_RATE])
        for name, port in (
            ("kube-scheduler", self.ports.scheduler),
            ("kube-controller-manager", self.ports.controller_manager),
        ):
            process = self.processes[name]
            until(
                lambda process=process, port=port: (
                    process.running() and host.http_get(f"https://127.0.0.1:{port}/healthz") == b"ok"
                ),
                START_TIMEOUT,
                f"{name} healthy",
                [process.log],
                interval=0.5,
            )

    def _write_tokens(self) -> None:
        """The API server's token file: one token per agent; each agent's token in its own file."""
        lines = []
        tokens = self.workdir / "tokens"
        tokens.mkdir(exist_ok=True)
        for index in range(self.agents):
            user, token = f"ix-fleet-agent-{index}", secrets.token_hex(16)
            lines.append(f'{token},{user},{user},"{AGENTS}"')
            path = tokens / user
            path.write_text(token)
            self.identities.append(AgentIdentity(user, path))
        (self.workdir / "tokens.csv").write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list[str]) -> Process:
        process = Process(name, argv, self.logdir / f"{name}.log").start()
        self.processes[name] = process
        return process

    def _start_etcd(self) -> None:
        etcd = self._spawn("etcd", components.etcd_argv(self.binaries, self.ports, self.workdir / "etcd"))
        until(
            lambda: etcd.running() and b'"health":"true"' in host.http_get(f"{self.etcd_url}/health"),
            30,
            "etcd healthy",
            [etcd.log],
        )

    @property
    def etcd_url(self) -> str:
        return components.etcd_client_url(self.ports)

    def start_apiserver(self) -> None:
        """Start kube-apiserver (again) and wait until it is ready."""
        assert self.pki is not None
        gates = components.feature_gates_flag(self.feature_gates)
        argv = components.apiserver_argv(self.binaries, self.ports, self.pki, self.node_ip, SERVICE_CIDR, gates)
        argv += [
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            f"--audit-policy-file={self.workdir / 'audit-policy.json'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-maxsize=0",
            # Without it kube-apiserver waits its whole 60 s request timeout at SIGTERM for any open watch, any
            # client's (docs/performance.md); with it, it ends them and exits in about a second.
            "--shutdown-watch-termination-grace-period=5s",
            "--max-requests-inflight=800",  # the defaults of a production control plane of this size
            "--max-mutating-requests-inflight=400",
        ]
        apiserver = self._spawn("kube-apiserver", argv)
        admin = self.admin
        until(
            lambda: apiserver.running() and admin("get", "--raw", "/readyz", timeout=10).strip() == "ok",
            START_TIMEOUT,
            "kube-apiserver ready",
            [apiserver.log],
            interval=0.5,
        )

    def stop_apiserver(self, timeout: float = 90.0) -> float:
        """SIGTERM to kube-apiserver; the seconds until it exited (SIGKILL after timeout)."""
        apiserver = self.processes.pop("kube-apiserver")
        started = time.monotonic()
        apiserver.signal(signal.SIGTERM)
        assert apiserver.popen is not None
        with contextlib.suppress(Exception):
            apiserver.popen.wait(timeout)
        exited = time.monotonic() - started
        apiserver.stop(1)
        return exited

    def stop(self) -> None:
        """Stop every component, the API server before etcd."""
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            if (process := self.processes.pop(name, None)) is not None:
                process.stop(5)

    def etcd_bytes_in_use(self) -> int:
        """etcd's database bytes in use (its own metric)."""
        for line in host.http_get(f"{self.etcd_url}/metrics").decode().splitlines():
            if line.startswith("etcd_mvcc_db_total_size_in_use_in_bytes "):
                return int(float(line.split()[1]))
        raise RuntimeError("etcd does not report etcd_mvcc_db_total_size_in_use_in_bytes")


def find_binaries() -> Binaries:
    """The end-to-end build's binaries; PlaneUnavailable saying how to build them."""
    binaries, why = built_binaries()
    if binaries is None:
        raise PlaneUnavailable(f"the fleet bench runs the real control plane: {why}")
    return binaries


@contextlib.contextmanager
def control_plane(agents: int, keep: Path | None = None) -> Iterator[ControlPlane]:
    """A started control plane for this many agents; stopped and its directory removed afterwards (the logs and
    the audit log are copied to keep when given)."""
    workdir = Path(tempfile.mkdtemp(prefix="ix-fleet-"))
    plane = ControlPlane(find_binaries(), workdir, agents)
    try:
        yield plane.start()
    finally:
        plane.stop()
        if keep is not None:
            shutil.copytree(plane.logdir, keep, dirs_exist_ok=True)
            if plane.audit_log.exists():
                shutil.copy2(plane.audit_log, keep / "audit.log")
        shutil.rmtree(workdir, ignore_errors=True)
