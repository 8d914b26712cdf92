"""The cluster's certificates, made with the openssl command: a CA, the API server's serving certificate and
one client certificate per identity (admin, controller-manager, scheduler, the kubelet's node identity, kube-proxy,
the API server's kubelet client), plus the service-account signing key. ECDSA P-256, valid two days.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .procs import run

CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
DAYS = "2"


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every file the control plane and the node need."""

    ca: KeyPair
    apiserver: KeyPair
    admin: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    kubelet_client: KeyPair  # the kubelet's node identity, towards the API server
    kubelet_serving: KeyPair
    kube_proxy: KeyPair  # system:kube-proxy, which the default ClusterRoleBinding system:node-proxier names
    apiserver_kubelet_client: KeyPair  # the API server towards the kubelet (logs, exec)
    front_proxy_client: KeyPair  # the API server towards aggregated API servers (request headers)
    service_account_key: Path
    service_account_pub: Path


def make_ca(directory: Path) -> KeyPair:
    """A self-signed CA."""
    pair = KeyPair(directory / "ca.crt", directory / "ca.key")
    run(
        [
            "openssl",
            "req",
            "-x509",
            *CURVE,
            "-keyout",
            str(pair.key),
            "-out",
            str(pair.cert),
            "-days",
            DAYS,
            "-subj",
            "/CN=ix-e2e-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ]
    )
    return pair


def make_leaf(
    ca: KeyPair | None, directory: Path, name: str, subject: str, server_names: list[str] | None = None
) -> KeyPair:
    """A certificate signed by ca (self-signed without one): a client certificate, also a serving one when
    server_names are given."""
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    usage = "serverAuth,clientAuth" if server_names else "clientAuth"
    argv = ["openssl", "req", "-x509", *CURVE, "-keyout", str(pair.key), "-out", str(pair.cert), "-days", DAYS]
    argv += [] if ca is None else ["-CA", str(ca.cert), "-CAkey", str(ca.key)]
    argv += ["-subj", subject]
    argv += ["-addext", "basicConstraints=critical,CA:FALSE", "-addext", f"extendedKeyUsage={usage}"]
    argv += ["-addext", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if server_names:
        entries = [f"IP:{n}" if n[0].isdigit() else f"DNS:{n}" for n in server_names]
        argv += ["-addext", "subjectAltName=" + ",".join(entries)]
    run(argv)
    return pair


def make_pki(directory: Path, node_name: str, node_ip: str, service_ip: str) -> Pki:
    """All certificates for a one-node cluster. The API server's names: 127.0.0.1 (the harness), the `kubernetes`
    Service's IP and names (pods, through kube-proxy) and node_ip, the endpoint it advertises behind the Service."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory)
    api_names = ["127.0.0.1", service_ip, node_ip, "localhost", "kubernetes", "kubernetes.default"]
    api_names += ["kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
    sa_key = directory / "sa.key"
    sa_pub = directory / "sa.pub"
    run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(sa_key)])
    run(["openssl", "ec", "-in", str(sa_key), "-pubout", "-out", str(sa_pub)])
    return Pki(
        ca=ca,
        apiserver=make_leaf(ca, directory, "apiserver", "/CN=kube-apiserver", api_names),
        admin=make_leaf(ca, directory, "admin", "/O=system:masters/CN=ix-e2e-admin"),
        controller_manager=make_leaf(ca, directory, "controller-manager", "/CN=system:kube-controller-manager"),
        scheduler=make_leaf(ca, directory, "scheduler", "/CN=system:kube-scheduler"),
        kubelet_client=make_leaf(ca, directory, "kubelet-client", f"/O=system:nodes/CN=system:node:{node_name}"),
        kubelet_serving=make_leaf(
            ca, directory, "kubelet-serving", f"/CN={node_name}", [node_ip, "127.0.0.1", node_name]
        ),
        kube_proxy=make_leaf(ca, directory, "kube-proxy", "/CN=system:kube-proxy"),
        apiserver_kubelet_client=make_leaf(
            ca, directory, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client"
        ),
        front_proxy_client=make_leaf(ca, directory, "front-proxy-client", "/CN=front-proxy-client"),
        service_account_key=sa_key,
        service_account_pub=sa_pub,
    )
