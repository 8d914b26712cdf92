"""How the kubelet finds the DRA driver: its sockets and the plugin watcher's Registration service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc

from ix_device_plugin.api.pluginregistration import api_pb2 as registration_pb2
from ix_device_plugin.api.pluginregistration import api_pb2_grpc as registration_grpc
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.kubelet.sockets import (
    Identity,
    identity,
    path_too_long,
    pod_tag,
    remove_unanswered,
    socket_answers,
    unanswered,
)
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.files import TEMPORARY_MAX_AGE, reason

log = logging.getLogger(__name__)

REGISTRATION_SOCKET = f"{DRIVER}-reg.sock"
DRA_SOCKET = "dra.sock"
PLUGIN_TYPE = "DRAPlugin"
# The kubelet opens the optional DRAResourceHealth stream only for a driver that lists it here (kubelet 1.34+).
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


def plugin_dir(plugins_dir: Path) -> Path:
    """The driver's directory under the kubelet's plugins directory (socket and checkpoint)."""
    return plugins_dir / DRIVER


# What to do about a socket path too long to serve: the kubelet dials these paths itself.
SHORTER_PATH = (
    "the kubelet dials this path itself, so it must be shorter on the host too: a kubelet with a shorter root "
    "directory (--root-dir), named here by --kubelet-registrar-directory-path and --kubelet-plugins-directory-path "
    "(the chart's dra.kubeletRegistrarDirectoryPath and dra.kubeletPluginsDirectoryPath)"
)


def registration_socket(registrar_dir: Path, pod_uid: str = "") -> Path:
    """Where the plugin watcher finds the driver: `gpu.iluvatar.com-reg.sock`, or `gpu.iluvatar.com-<pod tag>-reg.sock`
    per pod (see pod_tag), so that the next pod of an update registers beside this one (the kubelet allows it since
    1.33)."""
    return registrar_dir / (f"{DRIVER}-{pod_tag(pod_uid)}-reg.sock" if pod_uid else REGISTRATION_SOCKET)


def dra_socket(plugins_dir: Path, pod_uid: str = "") -> Path:
    """The DRAPlugin service's socket, the endpoint GetInfo names: `dra.sock`, or `dra-<pod tag>.sock` per pod."""
    return plugin_dir(plugins_dir) / (f"dra-{pod_tag(pod_uid)}.sock" if pod_uid else DRA_SOCKET)


def socket_paths_problem(sockets: Iterable[Path]) -> str | None:
    """Why the driver cannot serve the kubelet at one of sockets, or at the staging name it binds first (see
    staging_socket): a path over a unix socket's limit. None when all fit."""
    for path in sockets:
        for bound in (path, staging_socket(path)):
            if problem := path_too_long(bound, SHORTER_PATH):
                return problem
    return None


def stale_sockets(registrar_dir: Path, plugins_dir: Path) -> list[tuple[Path, Identity]]:
    """This driver's sockets that nothing serves any more (left by a pod that was killed), with the identity each
    had when found so: at the names the kubelet knows (named by the pod tag, or by the whole pod UID by an earlier
    release: the same prefixes), and at staging names (see staging_socket) once they are older than a start
    takes."""
    staging = [*registrar_dir.glob(f".{DRIVER}-*.sock"), *plugin_dir(plugins_dir).glob(".dra-*.sock")]
    candidates = [
        *registrar_dir.glob(f"{DRIVER}*-reg.sock"),
        *plugin_dir(plugins_dir).glob("dra*.sock"),
        *(path for path in staging if _age(path) > TEMPORARY_MAX_AGE),
    ]
    return unanswered(candidates)


def remove_stale_sockets(registrar_dir: Path, plugins_dir: Path) -> None:
    """Remove the sockets stale_sockets finds, each only while it is still the one found unanswered."""
    remove_unanswered(stale_sockets(registrar_dir, plugins_dir))


def staging_socket(path: Path) -> Path:
    """A private name beside path to serve on until the socket is moved to path in one step (see put_in_place).

    Binding a unix socket with gRPC unlinks whatever is at the name first, and stopping the server unlinks it
    again: served at path directly, one pod of the driver would remove the other's socket (without POD_UID both
    have the same names). A dot-name: the kubelet's plugin watcher ignores it.
    """
    prefix = DRIVER if path.name.startswith(DRIVER) else "dra"
    return path.with_name(f".{prefix}-{secrets.token_hex(4)}.sock")


def put_in_place(staging: Path, path: Path) -> Identity:
    """Move the socket served at staging to path (replacing what is there in one step); the identity of the socket
    now at path, to remove it at the stop only while it is still this one. StartupError when it cannot be moved."""
    if path.is_socket() and socket_answers(path):
        log.warning(
            "%s is served by another pod of this driver: this pod takes the name over and the kubelet reaches this "
            "one from now on (with POD_UID set, as the manifests set it, each pod has sockets of its own)",
            path,
        )
    try:
        os.rename(staging, path)
    except OSError as error:
        raise StartupError(f"cannot serve {path}: moving {staging} there: {reason(error)}") from None
    placed = identity(path)
    assert placed is not None
    return placed


def remove_own_socket(path: Path, own: Identity | None) -> None:
    """Remove the socket at path if it is still the one this pod put there (another pod may have replaced it)."""
    if own is not None and identity(path) == own:
        with contextlib.suppress(OSError):
            path.unlink()


def _age(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except OSError:
        return 0.0


class RegistrationService(registration_grpc.RegistrationServicer):
    """The plugin watcher's side: who we are, and what the kubelet made of it."""

    def __init__(self, endpoint: Path, on_registered: Callable[[], None] | None = None) -> None:
        self.endpoint = endpoint
        self.status: registration_pb2.RegistrationStatus | None = None
        self.registered = asyncio.Event()
        self.registrations = 0
        self._on_registered = on_registered or (lambda: None)

    async def GetInfo(
        self, request: registration_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> registration_pb2.PluginInfo:
        """Type DRAPlugin, the driver, its endpoint and the DRA services it serves."""
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint), supported_versions=list(SUPPORTED_VERSIONS)
        )

    async def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> registration_pb2.RegistrationStatusResponse:
        """Log the kubelet's verdict: registered, or refused and why."""
        self.status = request
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s (endpoint %s)", DRIVER, self.endpoint)
            self.registered.set()
            self.registrations += 1
            self._on_registered()  # a kubelet that (re)starts deletes the node's slices: publish them again
        else:
            log.error("the kubelet refused DRA driver %s: %s", DRIVER, request.error or "no reason given")
        return registration_pb2.RegistrationStatusResponse()
