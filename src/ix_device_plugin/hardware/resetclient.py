"""The agent's side of the reset helper: ask the privileged helper in the pod's other container to reset a chip.

Blocking, like run_ixsmi_reset, because it is called from the hardware worker thread. Every wait has a deadline,
and the connection stays open until the answer: closing it (abort set: the agent is stopping) is how the helper
learns to kill ixsmi. What the helper says is kept in the errors, so the agent's log and Events carry its words.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.resetprotocol import (
    MAX_ANSWER,
    OK,
    REFUSED,
    Answer,
    ProtocolError,
    ResetRequest,
    StatusRequest,
    format_request,
    parse_answer,
)

CONNECT_TIMEOUT = 1.0  # a helper that listens accepts at once; one that does not is not there
ANSWER_GRACE = 60.0  # beyond the reset's own timeout: the helper's discovery and close of IXML, the kill of ixsmi
STATUS_TIMEOUT = 5.0  # the helper answers `status` at once
POLL = 0.1  # seconds between looks at abort while waiting for the answer


class ResetRefused(BackendError):
    """The helper refused: nothing was reset (unknown chip, busy, rate-limited, cannot reset here)."""


class ResetHelperClient:
    """Asks the reset helper listening on socket_path; one connection per request."""

    def __init__(self, socket_path: Path | str, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.socket_path = Path(socket_path)
        self.connect_timeout = connect_timeout

    def reset(self, uuid: str, timeout: float, abort: threading.Event | None = None) -> None:
        """Reset the chip uuid; returns once the helper says it is done. Raises ResetRefused when the helper refused
        (nothing was reset), BackendError when the reset failed, the helper is not there or did not answer within
        timeout (plus a grace for its own work), or abort was set before the answer came (the connection is closed,
        and the helper kills ixsmi)."""
        try:
            request = format_request(ResetRequest(uuid))
        except ProtocolError as error:
            raise ResetRefused(f"reset helper: not asked: {error}") from None
        answer = self._ask(request, timeout + ANSWER_GRACE, abort)
        if answer.kind == OK:
            return
        error = ResetRefused if answer.kind == REFUSED else BackendError
        raise error(f"reset helper: {answer.kind}: {answer.text or 'no reason given'}")

    def status(self) -> str | None:
        """None when the helper says it can reset chips; else why not (the helper's words, or that it is not there)."""
        try:
            answer = self._ask(format_request(StatusRequest()), STATUS_TIMEOUT, None)
        except BackendError as error:
            return str(error)
        return None if answer.kind == OK else answer.text or f"the reset helper answered {answer.kind}"

    def _ask(self, request: bytes, timeout: float, abort: threading.Event | None) -> Answer:
        """Send request and read the one answer within timeout seconds, unless abort is set first."""
        where = f"reset helper at {self.socket_path}"
        with self._connect() as connection:
            try:
                connection.sendall(request)
                data = _read_line(connection, time.monotonic() + timeout, abort, where)
            except OSError as error:
                raise BackendError(f"{where}: {error.strerror or error}") from None
        if not data:
            raise BackendError(f"{where} closed the connection without an answer")
        try:
            return parse_answer(data)
        except ProtocolError as error:
            raise BackendError(f"{where}: bad answer: {error}") from None

    def _connect(self) -> socket.socket:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.settimeout(self.connect_timeout)
        try:
            connection.connect(str(self.socket_path))
        except (OSError, ValueError) as error:
            connection.close()
            why = getattr(error, "strerror", None) or error
            raise BackendError(
                f"no reset helper at {self.socket_path}: the reset helper is not running ({why})"
            ) from None
        return connection


def _read_line(connection: socket.socket, deadline: float, abort: threading.Event | None, where: str) -> bytes:
    """The answer line (up to MAX_ANSWER bytes; what came before the helper closed the connection); BackendError
    when the deadline passes or abort is set first (the caller then closes the connection)."""
    data = b""
    while not data.endswith(b"\n") and len(data) < MAX_ANSWER:
        if abort is not None and abort.is_set():
            raise BackendError(f"{where}: the reset was abandoned unfinished: the plugin is stopping")
        left = deadline - time.monotonic()
        if left <= 0:
            raise BackendError(f"{where} did not answer in time")
        connection.settimeout(min(POLL, left) if abort is not None else left)
        try:
            chunk = connection.recv(MAX_ANSWER - len(data))
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
    return data
