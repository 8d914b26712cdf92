"""The helper's listening socket, on which only root of the pod's containers may ask for a reset.

Made with mode 0600, in a directory made when missing, replacing a socket file only when nothing listens on it any
more (a helper that was killed), and removed at exit only while it is still the one this process made.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from pathlib import Path

log = logging.getLogger(__name__)

MAX_SOCKET_PATH = 107  # bytes of sun_path, its NUL aside
BACKLOG = 16
PROBE_TIMEOUT = 1.0  # a listening helper accepts at once


class ListenError(Exception):
    """The socket cannot be made: the message names the path and why."""


def listen(path: Path) -> tuple[socket.socket, int]:
    """A listening unix stream socket bound at path (mode 0600) and the inode of its file; ListenError naming why
    not (path too long, another helper listens there, a file that is not a socket is in the way)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ListenError(f"socket path {path} is {len(os.fsencode(path))} bytes, over the {MAX_SOCKET_PATH} a unix "
                          "socket takes")  # fmt: skip
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _clear_stale(path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _bind_private(server, path)
            server.listen(BACKLOG)
        except BaseException:
            server.close()
            raise
    except OSError as error:
        raise ListenError(f"cannot listen on {path}: {error.strerror or error}") from None
    return server, os.stat(path).st_ino


def remove(path: Path, inode: int) -> None:
    """Remove the socket file at path when it is still the one made (inode); another helper's is left alone."""
    try:
        if os.lstat(path).st_ino == inode:
            path.unlink()
    except OSError:
        pass


def _bind_private(server: socket.socket, path: Path) -> None:
    """Bind with a umask that makes the file 0600 from its first moment (no window with a wider mode)."""
    previous = os.umask(0o177)
    try:
        server.bind(str(path))
    finally:
        os.umask(previous)
    os.chmod(path, 0o600)


def _clear_stale(path: Path) -> None:
    """Remove a socket file at path that nothing listens on; ListenError when something does, or when what is
    there is not a socket (never removed: it is not ours)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ListenError(f"{path} exists and is not a socket; not removed")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        log.info("removed the stale socket %s (nothing listened on it)", path)
        return
    except TimeoutError:
        raise ListenError(f"{path}: something listens there but does not accept; not removed") from None
    finally:
        probe.close()
    raise ListenError(f"another reset helper listens on {path}")
