"""Random Allocate and GetPreferredAllocation requests over real gRPC (10 per example): no crash, clear errors."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from helpers.support import config_flags
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ix_device_plugin.api import api_pb2, api_pb2_grpc
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.kubelet.sockets import CHANNEL_OPTIONS, unix_target
from ix_device_plugin.settings.options import Options

BATCH = 10
ALLOWED_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}


class PluginThread:
    """A daemon serving on its own event loop in a background thread (no kubelet needed)."""

    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        options = Options(
            plugin_dir=root,
            config_path=root / "none",
            dev_root=root,
            health_address="off",
            health_interval=60,
            given=config_flags(replicas="3", splitboard="true"),
        )
        self.daemon = Daemon(options, backend_factory=lambda: SimulatedBackend("BI-V150:2,BI-V100:1"))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.daemon.start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.daemon.shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def plugin() -> Iterator[tuple[PluginThread, api_pb2_grpc.DevicePluginStub]]:
    root = Path(tempfile.mkdtemp(prefix="ixfz-", dir="/tmp"))
    server_log = logging.getLogger("ix_device_plugin.deviceplugin.service")
    server_log.setLevel(logging.ERROR)  # thousands of refusals would only be captured and dropped
    thread = PluginThread(root)
    channel = grpc.insecure_channel(unix_target(thread.daemon.socket_path), options=CHANNEL_OPTIONS)
    yield thread, api_pb2_grpc.DevicePluginStub(channel)
    channel.close()
    thread.stop()
    server_log.setLevel(logging.NOTSET)
    shutil.rmtree(root, ignore_errors=True)


def valid_ids(plugin: PluginThread) -> list[str]:
    return [d.id for d in plugin.daemon.plan.devices]


# Odd characters a broken client could send: NUL, separators, non-ASCII, the replica marker.
text = st.text(alphabet=st.sampled_from([*"GPU-abc019:,", "\x00", " ", "\u00e9", "\u6f22", "\U0001f600"]), max_size=70)


def requests(known: list[str]) -> st.SearchStrategy[list[tuple[str, object]]]:
    """A batch of Allocate and GetPreferredAllocation requests mixing valid and invalid IDs."""
    ids = st.lists(st.one_of(st.sampled_from(known), text, st.sampled_from(known).map(lambda s: s + "x")), max_size=8)
    allocate = st.tuples(st.just("allocate"), st.lists(ids, max_size=3))
    picks = st.lists(st.integers(0, 9), max_size=3)  # must-include, as positions in available
    prefer = st.tuples(st.just("preferred"), st.tuples(ids, picks, st.integers(-3, 12)))
    return st.lists(st.one_of(allocate, prefer), min_size=BATCH, max_size=BATCH)


def check_allocate(stub: api_pb2_grpc.DevicePluginStub, containers: list[list[str]]) -> None:
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )
    try:
        response = stub.Allocate(request, timeout=10)
    except grpc.RpcError as error:
        assert error.code() in ALLOWED_CODES, (error.code(), error.details())
        assert error.details()
        return
    assert len(response.container_responses) == len(containers)
    for ids, container in zip(containers, response.container_responses, strict=True):
        assert container.envs["IX_REPLICA_DEVICES"] == ",".join(ids)
        assert container.devices and all(d.permissions == "rw" for d in container.devices)


def check_preferred(stub: api_pb2_grpc.DevicePluginStub, available: list[str], must: list[str], size: int) -> None:
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )
    try:
        response = stub.GetPreferredAllocation(request, timeout=10)
    except grpc.RpcError as error:
        assert error.code() in ALLOWED_CODES, (error.code(), error.details())
        assert error.details()
        return
    chosen = list(response.container_responses[0].deviceIDs)
    assert len(chosen) == size == len(set(chosen))
    assert set(must) <= set(chosen) <= set(available)


@settings(deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_random_requests_never_break_the_server(
    plugin: tuple[PluginThread, api_pb2_grpc.DevicePluginStub], data: st.DataObject
) -> None:
    thread, stub = plugin
    for kind, payload in data.draw(requests(valid_ids(thread))):
        if kind == "allocate":
            check_allocate(stub, payload)  # type: ignore[arg-type]
        else:
            available, picks, size = payload  # type: ignore[misc]
            check_preferred(stub, available, [available[i] for i in picks if i < len(available)], size)


def test_server_still_answers_after_the_storm(plugin: tuple[PluginThread, api_pb2_grpc.DevicePluginStub]) -> None:
    thread, stub = plugin
    first = valid_ids(thread)[0]
    response = stub.Allocate(
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[first])]),
        timeout=10,
    )
    assert response.container_responses[0].envs["IX_REPLICA_DEVICES"] == first
