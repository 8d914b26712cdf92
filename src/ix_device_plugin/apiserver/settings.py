"""Where the API server is and who the plugin runs for: KubeSettings from the environment and --kubeconfig."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_TIMEOUT = 10.0  # seconds for one API call
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_MAX = 253


class KubeConfigError(Exception):
    """The plugin cannot tell how to reach the API server, or who it runs for; the message says what is missing."""


@dataclass(frozen=True)
class InCluster:
    """The service account the kubelet mounts into the pod, and the API server's in-cluster address."""

    server: str
    token_file: Path
    ca_file: Path


@dataclass(frozen=True)
class KubeSettings:
    """Who the plugin runs for (node, namespace) and how it reaches the API server."""

    node_name: str
    namespace: str
    kubeconfig: Path | None = None
    in_cluster: InCluster | None = None
    timeout: float = DEFAULT_TIMEOUT

    @property
    def source(self) -> str:
        """Where the API server's address comes from, for logs."""
        if self.kubeconfig is not None:
            return f"kubeconfig {self.kubeconfig}"
        assert self.in_cluster is not None
        return f"in-cluster service account ({self.in_cluster.server}, CA {self.in_cluster.ca_file})"


def settings_from(
    env: Mapping[str, str],
    kubeconfig_flag: str | None,
    needs: str,
    *,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> KubeSettings:
    """KubeSettings from the environment and the --kubeconfig flag; KubeConfigError naming what feature needs what.

    The node is NODE_NAME; the namespace POD_NAMESPACE, else the service account's, else kube-system. The API
    server is the --kubeconfig file, else the file named by KUBECONFIG, else the in-cluster service account.
    """
    node = env.get("NODE_NAME", "").strip()
    if not node:
        raise KubeConfigError(f"{needs} needs NODE_NAME (set it from the downward API: fieldRef spec.nodeName)")
    if len(node) > _NAME_MAX or not _DNS_SUBDOMAIN.match(node):
        raise KubeConfigError(f"{needs}: NODE_NAME {node!r} is not a valid node name (a DNS subdomain)")
    kubeconfig = _kubeconfig_path(env, kubeconfig_flag, needs)
    in_cluster = None if kubeconfig is not None else _in_cluster(env, needs, service_account_dir)
    return KubeSettings(node, _namespace(env, in_cluster, service_account_dir), kubeconfig, in_cluster)


def _kubeconfig_path(env: Mapping[str, str], flag: str | None, needs: str) -> Path | None:
    if flag:
        path = Path(flag)
        if not path.is_file():
            raise KubeConfigError(f"{needs}: --kubeconfig {flag}: no such file")
        return path
    listed = [Path(part) for part in env.get("KUBECONFIG", "").split(os.pathsep) if part]
    if not listed:
        return None
    for path in listed:
        if path.is_file():
            return path
    raise KubeConfigError(f"{needs}: KUBECONFIG={env['KUBECONFIG']}: no such file")


def _in_cluster(env: Mapping[str, str], needs: str, account: Path) -> InCluster:
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    token, ca = account / "token", account / "ca.crt"
    missing = [
        name for name, value in (("KUBERNETES_SERVICE_HOST", host), ("KUBERNETES_SERVICE_PORT", port)) if not value
    ]
    missing += [str(path) for path in (token, ca) if not path.is_file()]
    if missing:
        raise KubeConfigError(
            f"{needs} needs the Kubernetes API server: give --kubeconfig or KUBECONFIG, or run in a pod with a "
            f"service account (missing: {', '.join(missing)})"
        )
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return InCluster(f"https://{host}:{port}", token, ca)


def _namespace(env: Mapping[str, str], in_cluster: InCluster | None, account: Path) -> str:
    namespace = env.get("POD_NAMESPACE", "").strip()
    if namespace:
        return namespace
    if in_cluster is not None:
        with contextlib.suppress(OSError):
            namespace = (account / "namespace").read_text().strip()
    return namespace or DEFAULT_NAMESPACE
