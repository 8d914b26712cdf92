"""Log set-up: the libraries' own logs (an HTTP request each) show only at debug."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from ix_device_plugin.runtime.logs import LIBRARIES, setup


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in LIBRARIES}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


@pytest.mark.usefixtures("restore_logging")
def test_libraries_are_quiet_at_info_and_heard_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    setup("info")
    logging.getLogger("httpx2").info('HTTP Request: GET https://api/api/v1/pods "HTTP/1.1 200 OK"')
    logging.getLogger("lightkube").info("a library detail")
    logging.getLogger("ix_device_plugin.dra").info("our own line")
    logging.getLogger("httpcore2").warning("a library warning")
    logged = capsys.readouterr().err
    assert "HTTP Request" not in logged and "a library detail" not in logged
    assert "our own line" in logged and "a library warning" in logged

    setup("debug")
    logging.getLogger("httpx2").info('HTTP Request: GET https://api/api/v1/pods "HTTP/1.1 200 OK"')
    logging.getLogger("hpack.hpack").debug("decoded a header")
    logged = capsys.readouterr().err
    assert "HTTP Request" in logged and "decoded a header" in logged
