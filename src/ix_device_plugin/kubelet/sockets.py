"""Unix sockets shared with the kubelet: gRPC targets on them, telling a re-created socket from the old one,
and whether anything still serves one."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

# Newer grpcio percent-encodes a unix socket path into :authority, which the
# kubelet's HTTP/2 server rejects; name the authority explicitly. A private
# subchannel pool keeps a new channel from inheriting the reconnect backoff of
# an earlier one that found no kubelet (grpc shares subchannels process-wide).
CHANNEL_OPTIONS = (("grpc.default_authority", "localhost"), ("grpc.use_local_subchannel_pool", 1))


def unix_target(path: str | Path) -> str:
    """A gRPC target for the unix socket at path."""
    return f"unix://{Path(path).absolute()}"


Identity = tuple[int, int]
PATH_LIMIT = 107  # bytes of a unix socket's path: sun_path holds 108 with the closing NUL


def path_too_long(path: Path) -> str | None:
    """Why no one could connect to a unix socket at path (too long a path), None when one can."""
    size = len(str(path.absolute()).encode())
    if size <= PATH_LIMIT:
        return None
    return f"{path}: a unix socket's path is at most {PATH_LIMIT} bytes, this one has {size}"


def identity(path: Path) -> Identity | None:
    """(inode, ctime) of path, None when it does not exist: tells a re-created file from the old one."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def socket_answers(path: Path) -> bool:
    """True when something accepts connections on the unix socket at path."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def unanswered(candidates: Iterable[Path]) -> list[tuple[Path, Identity]]:
    """The sockets among candidates that nothing serves any more, with the identity each had when found so."""
    found = [(path, identity(path)) for path in candidates if path.is_socket()]
    return [(path, seen) for path, seen in found if seen is not None and not socket_answers(path)]


def remove_unanswered(stale: Iterable[tuple[Path, Identity]]) -> None:
    """Remove each socket found unanswered, only while it is still the one found (another process may have put a
    socket of its own at that name meanwhile)."""
    for path, seen in stale:
        if identity(path) == seen:
            with contextlib.suppress(OSError):
                path.unlink()
            log.info("removed %s: nothing serves it any more", path)
