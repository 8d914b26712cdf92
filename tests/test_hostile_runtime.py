"""Hostile things a node presents to a running plugin: odd files at the socket path, abusive probe clients."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from ix_device_plugin.errors import StartupError
from ix_device_plugin.kubelet_standin import KubeletStandIn

from support import RESOURCE, DaemonFactory

SOCKET = "iluvatar-gpu.sock"


async def test_a_regular_file_at_the_socket_path_is_named_as_such(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, plugin_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (plugin_dir / SOCKET).write_text("not a socket")
    caplog.set_level(logging.INFO, logger="ix_device_plugin.endpoint")
    await start_daemon("BI-V100:1")
    await kubelet.wait_registered(RESOURCE)
    messages = [record.getMessage() for record in caplog.records]
    assert any("removing a regular file at" in message for message in messages), messages
    assert not any("stale socket" in message for message in messages)


async def test_a_directory_at_the_socket_path_at_start_is_a_clear_error(
    start_daemon: DaemonFactory, plugin_dir: Path
) -> None:
    (plugin_dir / SOCKET).mkdir()
    with pytest.raises(StartupError, match="is a directory, where the plugin's socket should be; remove it"):
        await start_daemon("BI-V100:1")


async def test_a_probe_header_over_64k_is_answered_431_and_the_server_keeps_serving(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    daemon = await start_daemon("BI-V100:1", health_address="127.0.0.1:0")
    await kubelet.wait_registered(RESOURCE)

    async def request(head: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", daemon.probe_port)
        writer.write(head)
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return answer

    answer = await request(b"GET /healthz HTTP/1.1\r\nX-Junk: " + b"a" * 70_000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert (await request(b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
