"""The reset helper's wire protocol: any bytes give a request, an answer or a named ProtocolError, never another
exception; what is formatted parses back to itself; the text of an answer always fits its line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.hardware.resetprotocol import (
    FAILED,
    KINDS,
    MAX_ANSWER,
    MAX_REQUEST,
    OK,
    REFUSED,
    UUID,
    Answer,
    ProtocolError,
    ResetRequest,
    StatusRequest,
    format_answer,
    format_request,
    parse_answer,
    parse_request,
    sanitise,
)

uuids = st.from_regex(UUID, fullmatch=True)
printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=5000)


@given(st.binary(max_size=400))
def test_any_bytes_are_a_request_or_a_named_error(data: bytes) -> None:
    try:
        request = parse_request(data)
    except ProtocolError as error:
        assert str(error)
    else:
        assert format_request(request) == data


@given(st.binary(max_size=5000))
def test_any_bytes_are_an_answer_or_a_named_error(data: bytes) -> None:
    try:
        answer = parse_answer(data)
    except ProtocolError as error:
        assert str(error)
    else:
        assert answer.kind in KINDS and len(data) <= MAX_ANSWER


@given(uuids)
def test_a_reset_request_round_trips(uuid: str) -> None:
    assert parse_request(format_request(ResetRequest(uuid))) == ResetRequest(uuid)


def test_status_round_trips() -> None:
    assert parse_request(format_request(StatusRequest())) == StatusRequest()


@given(st.sampled_from(KINDS), st.text(max_size=6000))
def test_any_answer_text_is_sent_sanitised_and_parses_back(kind: str, text: str) -> None:
    line = format_answer(Answer(kind, text))
    assert len(line) <= MAX_ANSWER
    assert parse_answer(line) == Answer(kind, sanitise(text, MAX_ANSWER - len(kind) - 2))


@given(st.sampled_from(KINDS), printable)
def test_a_clean_answer_round_trips_exactly(kind: str, text: str) -> None:
    clean = " ".join(text.split())[: MAX_ANSWER - len(kind) - 2]
    assert parse_answer(format_answer(Answer(kind, clean))) == Answer(kind, clean)


@given(st.text(max_size=3000), st.integers(min_value=0, max_value=4000))
def test_sanitised_text_is_one_printable_line_within_the_limit(text: str, limit: int) -> None:
    clean = sanitise(text, limit)
    assert len(clean) <= limit and clean.isascii() and clean.isprintable() and "\n" not in clean


def test_a_long_output_keeps_its_end() -> None:
    assert sanitise("x" * 100 + " the reason", 20) == "...xxxxxx the reason"


REQUEST_ERRORS = [
    (b"status", "the request does not end with a newline"),
    (b"status\nstatus\n", "the request holds more than one line"),
    (b"reset chip \xff\n", "the request holds a byte that is not printable ASCII"),
    (b"reset chip a\tb\n", "not printable ASCII"),
    (b"reset chip " + b"a" * 250 + b"\n", f"the request is 262 bytes, over the limit of {MAX_REQUEST}"),
    (b"reboot\n", "unknown request 'reboot': expected `reset chip <UUID>` or `status`"),
    (b"reset chip\n", "`reset chip` takes exactly one UUID"),
    (b"reset chip a b\n", "`reset chip` takes exactly one UUID"),
    (b"reset chip  a\n", "`reset chip` takes exactly one UUID"),
    (b"reset chip -a\n", "'-a' is not a chip UUID"),
    (b"reset chip ../x\n", "'../x' is not a chip UUID"),
    (b"reset chip " + b"a" * 64 + b"\n", "is not a chip UUID"),
    (b"status \n", "unknown request 'status '"),
]


@pytest.mark.parametrize(("data", "message"), REQUEST_ERRORS)
def test_a_malformed_request_names_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_request(data)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("data", "answer"),
    [
        (b"ok\n", Answer(OK, "")),
        (b"ok reset GPU-1\n", Answer(OK, "reset GPU-1")),
        (b"refused busy: resetting GPU-1\n", Answer(REFUSED, "busy: resetting GPU-1")),
        (b"failed ixsmi exited with code 1: boom\n", Answer(FAILED, "ixsmi exited with code 1: boom")),
    ],
)
def test_answers_parse(data: bytes, answer: Answer) -> None:
    assert parse_answer(data) == answer


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"maybe so\n", "unknown answer 'maybe so'"),
        (b"OK fine\n", "unknown answer"),
        (b"ok " + b"x" * MAX_ANSWER + b"\n", "over the limit of 4096"),
        (b"ok \x1b[31m\n", "not printable ASCII"),
        (b"", "does not end with a newline"),
    ],
)
def test_a_malformed_answer_names_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse_answer(data)
    assert message in str(refused.value)


def test_a_uuid_off_the_grammar_is_not_sent() -> None:
    with pytest.raises(ProtocolError, match="is not a chip UUID"):
        format_request(ResetRequest("a b\nstatus"))
