"""The agent's reset-helper client against a raw socket that answers whatever a test says: a helper's answer is
another process's input, and every way it can go wrong is a BackendError naming the socket, never a hang."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from ix_device_plugin.hardware import resetclient
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.resetclient import ResetHelperClient, ResetRefused


class RawHelper:
    """Listens at path; to each connection reads one request line, records it, sends `reply` (None: nothing), and
    closes at once or, with `hold`, when the client does."""

    def __init__(self, path: Path, reply: bytes | None, hold: bool = False) -> None:
        self.reply, self.hold = reply, hold
        self.requests: list[bytes] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.closed_by_client = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(30)
                self.requests.append(connection.recv(4096))
                if self.reply is not None:
                    connection.sendall(self.reply)
                if self.hold and connection.recv(1) == b"":
                    self.closed_by_client.set()


@pytest.fixture
def path(short_dir: Path) -> Path:
    return short_dir / "helper.sock"


@pytest.mark.parametrize(
    ("reply", "error", "words"),
    [
        (b"refused busy: resetting GPU-a\n", ResetRefused, "reset helper: refused: busy: resetting GPU-a"),
        (b"failed ixsmi exited with code 1\n", BackendError, "reset helper: failed: ixsmi exited with code 1"),
        (b"maybe\n", BackendError, "bad answer: unknown answer 'maybe'"),
        (b"ok \xff\n", BackendError, "bad answer: the answer holds a byte that is not printable ASCII"),
        (b"ok", BackendError, "bad answer: the answer does not end with a newline"),
        (b"", BackendError, "closed the connection without an answer"),
        (b"x" * 5000, BackendError, "bad answer: the answer does not end with a newline"),
    ],
)
def test_what_the_helper_says_is_what_the_agent_raises(
    path: Path, reply: bytes, error: type[BackendError], words: str
) -> None:
    helper = RawHelper(path, reply)
    with pytest.raises(error) as raised:
        ResetHelperClient(path).reset("GPU-a", timeout=5)
    assert words in str(raised.value)
    assert helper.requests == [b"reset chip GPU-a\n"]


def test_ok_returns_and_status_reads_ok_as_none(path: Path) -> None:
    RawHelper(path, b"ok ready\n")
    client = ResetHelperClient(path)
    client.reset("GPU-a", timeout=5)
    assert client.status() is None


def test_a_refused_status_is_the_reason(path: Path) -> None:
    RawHelper(path, b"refused cannot reset here: this process lacks CAP_SYS_ADMIN\n")
    assert ResetHelperClient(path).status() == "cannot reset here: this process lacks CAP_SYS_ADMIN"


def test_an_abort_closes_the_connection_and_raises(path: Path) -> None:
    helper = RawHelper(path, None, hold=True)
    abort = threading.Event()
    outcome: list[BaseException] = []

    def reset() -> None:
        try:
            ResetHelperClient(path).reset("GPU-a", timeout=30, abort=abort)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=reset, daemon=True)
    thread.start()
    abort.set()
    assert helper.closed_by_client.wait(10)
    thread.join(10)
    assert len(outcome) == 1 and "abandoned unfinished" in str(outcome[0])


def test_a_helper_that_never_answers_is_given_up_on(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resetclient, "ANSWER_GRACE", 0.0)
    helper = RawHelper(path, None, hold=True)
    with pytest.raises(BackendError, match="did not answer in time"):
        ResetHelperClient(path).reset("GPU-a", timeout=0.3)
    assert helper.closed_by_client.wait(10)


def test_a_uuid_off_the_grammar_is_refused_before_anything_is_sent(path: Path) -> None:
    helper = RawHelper(path, b"ok\n")
    with pytest.raises(ResetRefused, match="not asked: 'GPU a' is not a chip UUID"):
        ResetHelperClient(path).reset("GPU a", timeout=5)
    assert helper.requests == []


def test_a_socket_nobody_listens_on_says_the_helper_is_not_running(path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    status = ResetHelperClient(path).status()
    assert status == f"no reset helper at {path}: the reset helper is not running (Connection refused)"
