"""Hostile things a node presents to a running plugin: odd files at the socket path, abusive probe clients."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from helpers.support import RESOURCE, DaemonFactory, config_flags
from helpers.waits import stays, until

from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.tools.demo import ConfigMapDir

SOCKET = "iluvatar-gpu.sock"


async def test_a_regular_file_at_the_socket_path_is_named_as_such(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, plugin_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (plugin_dir / SOCKET).write_text("not a socket")
    caplog.set_level(logging.INFO, logger="ix_device_plugin.deviceplugin.endpoint")
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
        reader, writer = await asyncio.open_connection("127.0.0.1", daemon.node.probe_port)
        writer.write(head)
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return answer

    answer = await request(b"GET /healthz HTTP/1.1\r\nX-Junk: " + b"a" * 70_000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert (await request(b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_chip_gone_from_enumeration_keeps_its_board_unhealthy(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    devices = short_dir / "devices.yaml"
    both = "boards:\n  - product: BI-V150\n    chips:\n      - uuid: GPU-a\n      - uuid: GPU-b\n"
    devices.write_text(both)
    await start_daemon(str(devices), rediscover_interval=0.3)
    view = await kubelet.wait_registered(RESOURCE, capacity=1)
    devices.write_text("boards:\n  - product: BI-V150\n    chips:\n      - uuid: GPU-a\n")  # GPU-b not listed
    await kubelet.wait_for(lambda: view.allocatable == 0, timeout=5)
    await stays(
        lambda: (view.capacity, view.allocatable) == (1, 0),
        for_=1.0,
        message="several rediscoveries later: still Unhealthy, still one device",
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [["GPU-a"]])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "GPU-b" in (refused.value.details() or "")
    devices.write_text(both)
    await kubelet.wait_for(lambda: view.allocatable == 1, timeout=5)


async def test_a_device_list_too_large_for_the_kubelet_is_refused_like_a_bad_config(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="ix_device_plugin.deviceplugin.daemon")
    configmap = ConfigMapDir(short_dir / "ixconfig")
    configmap.write("sharing:\n  timeSlicing:\n    replicas: 2\n")
    await start_daemon(
        "BI-V150:40", config_path=configmap.path, config_required=True, given=config_flags(splitboard="true")
    )
    await kubelet.wait_registered(RESOURCE, capacity=160, timeout=10)
    configmap.write("sharing:\n  timeSlicing:\n    replicas: 1024\n")  # 81,920 devices: about 5.6 MB
    await until(lambda: any("over the kubelet's 4 MiB limit" in r.getMessage() for r in caplog.records), timeout=5)
    message = next(r.getMessage() for r in caplog.records if "4 MiB" in r.getMessage())
    assert "config change rejected, keeping the last good configuration" in message
    assert "the largest value that fits is" in message
    assert kubelet.capacity(RESOURCE) == 160
