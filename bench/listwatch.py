"""ListAndWatch on the large node: encoding the full list, and delivering it to a client stream."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from bench.plugin import LARGE, PluginProcess, write_atomically
from bench.settings import Settings
from bench.stats import summary_ms
from ix_device_plugin.api import api_pb2, api_pb2_grpc
from ix_device_plugin.core.plan import plan
from ix_device_plugin.deviceplugin.service import list_response
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.kubelet.sockets import CHANNEL_OPTIONS
from ix_device_plugin.settings.config import Config

READ_TIMEOUT = 10.0


def encode(runs: int) -> dict[str, Any]:
    """In-process: building the message for the full plan (server.list_response), serializing and parsing it."""
    inventory = SimulatedBackend(LARGE.spec).discover()
    large = plan(inventory, Config(splitboard=LARGE.splitboard, replicas=LARGE.replicas))
    build: list[float] = []
    serialize: list[float] = []
    parse: list[float] = []
    data = b""
    for _ in range(runs):
        started = time.perf_counter()
        message = list_response(large)
        built = time.perf_counter()
        data = message.SerializeToString()
        serialized = time.perf_counter()
        api_pb2.ListAndWatchResponse.FromString(data)
        parsed = time.perf_counter()
        build.append(built - started)
        serialize.append(serialized - built)
        parse.append(parsed - serialized)
    return {
        "devices": len(large.devices),
        "bytes": len(data),
        "build": summary_ms(build),
        "serialize": summary_ms(serialize),
        "parse": summary_ms(parse),
    }


async def _fresh_streams(stub: api_pb2_grpc.DevicePluginStub, runs: int, capacity: int) -> list[float]:
    samples: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        call = stub.ListAndWatch(api_pb2.Empty())
        async with asyncio.timeout(READ_TIMEOUT):
            message = await call.read()
        samples.append(time.perf_counter() - started)
        call.cancel()
        assert len(message.devices) == capacity, len(message.devices)
    return samples


async def _pushes(plugin: PluginProcess, stub: api_pb2_grpc.DevicePluginStub, runs: int) -> list[float]:
    node = plugin.node
    call = stub.ListAndWatch(api_pb2.Empty())
    async with asyncio.timeout(READ_TIMEOUT):
        await call.read()
    samples: list[float] = []
    try:
        for run in range(runs):
            replicas = node.replicas - 1 if run % 2 == 0 else node.replicas
            write_atomically(plugin.config_path, node.config_yaml(replicas))
            written = time.perf_counter()
            async with asyncio.timeout(READ_TIMEOUT):
                message = await call.read()
            samples.append(time.perf_counter() - written)
            assert len(message.devices) == node.capacity // node.replicas * replicas, len(message.devices)
            await asyncio.sleep(0.05)  # let the stand-in take the message too before the next change
    finally:
        call.cancel()
    return samples


async def run(settings: Settings) -> dict[str, Any]:
    """Encode times in-process; first message on a fresh stream and pushes after a config edit, at a client."""
    result: dict[str, Any] = {"encode": encode(max(settings.listwatch_runs, 5))}
    async with PluginProcess(LARGE) as plugin:
        await plugin.launch()
        async with grpc.aio.insecure_channel(plugin.target, options=CHANNEL_OPTIONS) as channel:
            async with asyncio.timeout(READ_TIMEOUT):
                await channel.channel_ready()
            stub = api_pb2_grpc.DevicePluginStub(channel)
            result["fresh_stream"] = summary_ms(await _fresh_streams(stub, settings.listwatch_runs, LARGE.capacity))
            result["config_edit_push"] = summary_ms(await _pushes(plugin, stub, settings.listwatch_runs))
    encoded = result["encode"]
    result["build_plus_delivery_ms"] = round(encoded["build"]["median_ms"] + result["fresh_stream"]["median_ms"], 3)
    return result
