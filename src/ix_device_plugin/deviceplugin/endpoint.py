"""The plugin's endpoint: its unix socket and the gRPC server on it, with the stale-socket check."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import grpc

from ix_device_plugin.api import api_pb2_grpc
from ix_device_plugin.deviceplugin.service import BeforeAllocate, CallObserver, DevicePluginService
from ix_device_plugin.deviceplugin.state import Current
from ix_device_plugin.kubelet.sockets import (
    Identity,
    identity,
    path_too_long,
    pod_tag,
    remove_unanswered,
    socket_answers,
    unanswered,
    unix_target,
)
from ix_device_plugin.runtime.errors import StartupError

log = logging.getLogger(__name__)

ENDPOINT = "iluvatar-gpu.sock"  # a plugin started by hand, without a pod UID
# What to do about a socket path too long to serve: the kubelet dials its own fixed directory, so only the path the
# plugin sees needs to be shorter.
SHORTER_PATH = (
    "mount the kubelet's device-plugin directory (/var/lib/kubelet/device-plugins on the host) at a shorter path "
    "and name it with --device-plugin-path (IX_DEVICE_PLUGIN_PATH; the chart's devicePluginPath)"
)


def plugin_socket(plugin_dir: Path, pod_uid: str = "") -> Path:
    """The plugin's socket in the kubelet's device-plugin directory: one per pod (iluvatar-gpu-<pod tag>.sock, see
    pod_tag), so that during an update the new pod serves beside the old one; ENDPOINT without a pod UID.

    The prefix is the one earlier releases used with the whole pod UID: other_pods_sockets finds theirs too."""
    return plugin_dir / (f"iluvatar-gpu-{pod_tag(pod_uid)}.sock" if pod_uid else ENDPOINT)


class Endpoint:
    """Serves the DevicePlugin service for the Current state on one socket path."""

    def __init__(
        self,
        path: Path,
        current: Current,
        observer: CallObserver | None = None,
        before_allocate: BeforeAllocate | None = None,
    ) -> None:
        self.path = path
        self._current = current
        self._observer = observer
        self._before_allocate = before_allocate
        self.service: DevicePluginService | None = None
        self._server: grpc.aio.Server | None = None
        self._identity: Identity | None = None
        self.resource_name = ""  # what it was started for

    @property
    def serving(self) -> bool:
        """True while the server runs and its socket is still the one it created."""
        return self._server is not None and identity(self.path) == self._identity

    @property
    def followed(self) -> bool:
        """True while it serves and a kubelet follows its ListAndWatch (a stream is open)."""
        return self.serving and self.service is not None and self.service.streams > 0

    def followed_since(self, since: float) -> bool:
        """True while a kubelet follows its ListAndWatch on a stream opened at `since` (time.monotonic()) or later:
        a kubelet that dialed it after then, not one that followed it before and is going away."""
        return self.followed and self.service is not None and self.service.newest_stream >= since

    async def start(self, resource_name: str) -> None:
        """Clear the way, listen on the socket and serve; raises StartupError saying why not."""
        self._clear_the_way()
        remove_unanswered(unanswered(other_pods_sockets(self.path)))  # left by pods that were killed
        service = DevicePluginService(self._current, self._observer, self._before_allocate)
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(service, server)
        try:
            server.add_insecure_port(unix_target(self.path))
        except RuntimeError as error:
            raise StartupError(f"cannot listen on {self.path}: {error}") from error
        await server.start()
        self.service, self._server = service, server
        self._identity = identity(self.path)
        self.resource_name = resource_name
        log.info("serving %s on %s", resource_name, self.path)

    async def stop(self, grace: float) -> None:
        """End every stream, stop the server, remove the socket if it is still ours."""
        service, server = self.service, self._server
        self.service, self._server = None, None
        if service is not None:
            service.close()
        if server is not None:
            await server.stop(grace)
        if self._identity is not None and identity(self.path) == self._identity:
            self.path.unlink(missing_ok=True)
        self._identity = None

    async def converge(self, resource_name: str) -> str | None:
        """Serve resource_name, (re)starting when the socket was lost or the name changed; why it restarted.

        None when it already served it; raises StartupError when it cannot serve again.
        """
        if self.serving and self.resource_name == resource_name:
            return None
        if self.service is None:
            reason = "not serving"
        elif not self.serving:
            reason = f"socket {self.path} was removed"
        else:
            reason = f"resource name changed to {resource_name}"
        await self.stop(grace=0)
        await self.start(resource_name)
        return reason

    def remove_socket(self) -> None:
        """Remove our socket file, if it is still ours (a stop that could not finish still cleans up), and the ones
        other pods left when they were killed: a pod deleted as its container started may have had its SIGTERM
        dropped before it could take it (runtime/earlystop.py), and been killed with its socket in place; the pods
        still running when the plugin is uninstalled are the last that can remove it."""
        if self._identity is not None and identity(self.path) == self._identity:
            self.path.unlink(missing_ok=True)
        remove_unanswered(unanswered(other_pods_sockets(self.path)))

    def check_path(self) -> None:
        """StartupError when the socket's path is too long for a unix socket (before anything else starts)."""
        if problem := path_too_long(self.path, SHORTER_PATH):
            raise StartupError(problem)

    def _clear_the_way(self) -> None:
        path = self.path
        self.check_path()
        if not path.parent.is_dir():
            raise StartupError(
                f"device plugin directory {path.parent} does not exist (is the kubelet's "
                "/var/lib/kubelet/device-plugins mounted? see --device-plugin-path)"
            )
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(mode):
            raise StartupError(f"{path} is a directory, where the plugin's socket should be; remove it")
        if stat.S_ISSOCK(mode):
            if socket_answers(path):
                raise StartupError(
                    f"another plugin is already serving on {path}; stop it first (or remove the socket "
                    "if you are sure it is gone)"
                )
            log.info("removing stale socket %s", path)
        else:
            log.warning("removing %s at %s, where the plugin's socket goes", _kind(mode), path)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            raise StartupError(f"cannot remove {path}: {error.strerror or error}") from error


def other_pods_sockets(path: Path) -> list[Path]:
    """The per-pod sockets of the plugin's other pods beside path (a pod that was killed left its own behind),
    named by the pod tag or, by an earlier release, by the whole pod UID.

    gRPC listens on a socket as it binds it, so one that does not answer is not another pod's just starting."""
    return [other for other in path.parent.glob("iluvatar-gpu-*.sock") if other != path]


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a file"
