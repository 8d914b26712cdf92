"""Unix sockets shared with the kubelet.

gRPC targets on them, telling a re-created socket from the old one, and whether anything still serves one.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterable
from pathlib import Path

try:  # the interpreter's own SHA-256: OpenSSL's hashes (hashlib) take 0.6 MiB, and every pod names its sockets
    from _sha256 import sha256 as _sha256  # Python 3.11
except ImportError:  # pragma: no cover - a later interpreter's name for it, or one built without it
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[import-not-found,no-redef]
    except ImportError:
        from hashlib import sha256 as _sha256

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
POD_TAG_DIGITS = 8  # hex digits of the per-pod part of a socket's name


def pod_tag(pod_uid: str) -> str:
    """The per-pod part of a socket's name: the first 8 hex digits of the SHA-256 of the pod's UID.

    The kubelet dials `<its directory>/<name>`, and a pod's UID (36 bytes) in the name leaves too little of the
    107 bytes for a kubelet root such as MicroK8s's. 32 bits tell apart the two or three pods of one DaemonSet that
    overlap on a node (a clash has odds of about 1 in 1.4 billion per update), whatever form the UID has.
    """
    return _sha256(pod_uid.encode()).hexdigest()[:POD_TAG_DIGITS]


def path_too_long(path: Path, fix: str) -> str | None:
    """Why a unix socket cannot be served at path (its path is over PATH_LIMIT bytes), fix saying what to do about
    it; None when it fits."""
    size = len(str(path.absolute()).encode())
    if size <= PATH_LIMIT:
        return None
    return (
        f"cannot serve the kubelet at {path}: the path has {size} bytes, and a unix socket's path is at most "
        f"{PATH_LIMIT}; {fix}"
    )


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
