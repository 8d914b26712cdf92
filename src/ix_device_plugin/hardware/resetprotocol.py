"""The wire protocol between the agent and the privileged reset helper: pure, no sockets.

One request per connection over a unix stream socket, one line each way, ASCII, ending in `\\n`:

    request:  `reset chip <UUID>` | `status`                          (at most MAX_REQUEST bytes)
    answer:   `ok <text>` | `refused <text>` | `failed <text>`       (at most MAX_ANSWER bytes)

`refused` says nothing was reset (unknown chip, busy, rate-limited, cannot reset here); `failed` says ixsmi ran and
failed or overran its deadline. Both ends are another process's input: every byte is checked, and anything off the
grammar is a ProtocolError naming what was wrong, never another exception. The text of an answer is printable
ASCII without a newline; `sanitise` makes any text (ixsmi's output) fit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_REQUEST = 256
MAX_ANSWER = 4096
UUID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # the simulated backend's rule; IXML's GPU-... fits
OK, REFUSED, FAILED = "ok", "refused", "failed"
CANNOT_RESET = "cannot reset here"  # a refusal's first words where the helper lacks what ixsmi -r needs
KINDS = (OK, REFUSED, FAILED)
_PRINTABLE = re.compile(r"[ -~]*")  # printable ASCII, space included


class ProtocolError(ValueError):
    """A request or an answer off the grammar; the message names what was wrong."""


@dataclass(frozen=True)
class ResetRequest:
    """`reset chip <uuid>`: reset this one chip."""

    uuid: str


@dataclass(frozen=True)
class StatusRequest:
    """`status`: can the helper reset chips at all, and if not, why."""


Request = ResetRequest | StatusRequest


@dataclass(frozen=True)
class Answer:
    """`<kind> <text>`: kind is ok, refused or failed; text is printable ASCII (may be empty)."""

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ProtocolError(f"answer kind {self.kind!r} is not one of {', '.join(KINDS)}")


def _line(data: bytes, limit: int, what: str) -> str:
    """The one line data holds, without its `\\n`; ProtocolError when it is too long, unterminated, holds more than
    one line, or is not printable ASCII."""
    if len(data) > limit:
        raise ProtocolError(f"{what} is {len(data)} bytes, over the limit of {limit}")
    if not data.endswith(b"\n"):
        raise ProtocolError(f"{what} does not end with a newline")
    body = data[:-1]
    if b"\n" in body:
        raise ProtocolError(f"{what} holds more than one line")
    if not body.isascii() or not _PRINTABLE.fullmatch(body.decode("ascii")):
        raise ProtocolError(f"{what} holds a byte that is not printable ASCII")
    return body.decode("ascii")


def parse_request(data: bytes) -> Request:
    """The request data holds (its `\\n` included); ProtocolError naming what is wrong."""
    line = _line(data, MAX_REQUEST, "the request")
    if line == "status":
        return StatusRequest()
    words = line.split(" ")
    if words[:2] != ["reset", "chip"]:
        raise ProtocolError(f"unknown request {_shown(line)}: expected `reset chip <UUID>` or `status`")
    if len(words) != 3:
        raise ProtocolError("`reset chip` takes exactly one UUID, separated by single spaces")
    if not UUID.fullmatch(words[2]):
        raise ProtocolError(f"{_shown(words[2])} is not a chip UUID (letters, digits, _ . -; at most 63)")
    return ResetRequest(words[2])


def format_request(request: Request) -> bytes:
    """The line that asks for request (a ResetRequest's UUID is checked: ProtocolError)."""
    if isinstance(request, StatusRequest):
        return b"status\n"
    if not UUID.fullmatch(request.uuid):
        raise ProtocolError(f"{_shown(request.uuid)} is not a chip UUID (letters, digits, _ . -; at most 63)")
    return f"reset chip {request.uuid}\n".encode("ascii")


def parse_answer(data: bytes) -> Answer:
    """The answer data holds (its `\\n` included); ProtocolError naming what is wrong."""
    line = _line(data, MAX_ANSWER, "the answer")
    kind, _, text = line.partition(" ")
    if kind not in KINDS:
        raise ProtocolError(f"unknown answer {_shown(line)}: expected ok, refused or failed")
    return Answer(kind, text)


def format_answer(answer: Answer) -> bytes:
    """The line of answer, its text sanitised to fit (printable, one line, within MAX_ANSWER)."""
    room = MAX_ANSWER - len(answer.kind) - 2  # the space and the newline
    text = sanitise(answer.text, room)
    return f"{answer.kind} {text}\n".encode("ascii") if text else f"{answer.kind}\n".encode("ascii")


def sanitise(text: str, limit: int) -> str:
    """text as one line of printable ASCII of at most limit characters: whitespace runs become one space, any other
    character outside printable ASCII becomes `?`, and a text too long keeps its end (where ixsmi says why),
    marked with a leading `...`."""
    words = "".join(char if " " <= char <= "~" else "?" for char in " ".join(text.split()))
    if len(words) <= limit:
        return words
    return "..." + words[len(words) - limit + 3 :] if limit > 3 else words[len(words) - limit :]


def _shown(text: str) -> str:
    """A piece of what was received, short enough for a message."""
    return repr(text if len(text) <= 40 else text[:40] + "...")
