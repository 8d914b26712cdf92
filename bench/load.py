"""Calling a device plugin as the kubelet does: sequentially, or from several callers at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from bench.stats import latency_ms
from ix_device_plugin.api import api_pb2, api_pb2_grpc
from ix_device_plugin.kubelet.sockets import CHANNEL_OPTIONS

CALL_TIMEOUT = 10.0
ALLOCATE = "Allocate"
PREFERRED = "GetPreferredAllocation"
# (method name, request) pairs; a run cycles through them.
Call = tuple[str, Any]


@dataclass(frozen=True)
class Load:
    """How many calls a latency measurement makes."""

    calls: int
    callers: int
    warmup: int
    rounds: int = 1


def allocate_calls(device_ids: Sequence[str], per_container: int = 1) -> list[Call]:
    """Allocate requests for one container each, walking through device_ids."""
    calls: list[Call] = []
    for start in range(0, len(device_ids) - per_container + 1, per_container):
        ids = list(device_ids[start : start + per_container])
        request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
        calls.append((ALLOCATE, request))
    return calls


def preferred_calls(available: Sequence[str], size: int) -> list[Call]:
    """One GetPreferredAllocation request: size devices out of available, none must be included."""
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=list(available), allocation_size=size)
        ]
    )
    return [(PREFERRED, request)]


def run_sequential(target: str, calls: Sequence[Call], count: int, warmup: int) -> list[float]:
    """Latencies (s) of count calls made one after another with a blocking stub (call it in a thread)."""
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT)
        stub = api_pb2_grpc.DevicePluginStub(channel)
        methods = [(getattr(stub, method), request) for method, request in calls]
        for index in range(warmup):
            method, request = methods[index % len(methods)]
            method(request, timeout=CALL_TIMEOUT)
        latencies: list[float] = []
        for index in range(count):
            method, request = methods[index % len(methods)]
            started = time.perf_counter()
            method(request, timeout=CALL_TIMEOUT)
            latencies.append(time.perf_counter() - started)
    return latencies


async def run_concurrent(
    target: str, calls: Sequence[Call], count: int, callers: int, warmup: int
) -> tuple[list[float], float]:
    """Latencies (s) of count calls shared by callers concurrent callers on one channel, and the wall time."""
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        async with asyncio.timeout(CALL_TIMEOUT):
            await channel.channel_ready()
        stub = api_pb2_grpc.DevicePluginStub(channel)
        methods = [(getattr(stub, method), request) for method, request in calls]
        latencies: list[float] = []

        async def caller(first: int, total: int, record: bool) -> None:
            for index in range(first, total, callers):
                method, request = methods[index % len(methods)]
                started = time.perf_counter()
                await method(request, timeout=CALL_TIMEOUT)
                if record:
                    latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(caller(k, warmup, False) for k in range(callers)))
        started = time.perf_counter()
        await asyncio.gather(*(caller(k, count, True) for k in range(callers)))
        wall = time.perf_counter() - started
    return latencies, wall


def _summary(latencies: list[float], busy: float) -> dict[str, float]:
    return {**latency_ms(latencies), "calls_per_s": round(len(latencies) / busy, 1)}


async def measure(targets: Mapping[str, str], calls: Sequence[Call], load: Load) -> dict[str, dict[str, Any]]:
    """For each target, p50/p99 and throughput of calls made sequentially and by load.callers callers.

    The calls are split into load.rounds rounds that take turns between the targets, so that every
    target sees the same conditions when the machine's speed drifts.
    """
    per_round = load.calls // load.rounds
    warmup = max(load.warmup // load.rounds, load.callers)
    sequential: dict[str, list[float]] = {name: [] for name in targets}
    concurrent: dict[str, list[float]] = {name: [] for name in targets}
    walls = dict.fromkeys(targets, 0.0)
    order = list(targets)
    for round_index in range(load.rounds):
        for name in order if round_index % 2 == 0 else reversed(order):
            target = targets[name]
            sequential[name] += await asyncio.to_thread(run_sequential, target, calls, per_round, warmup)
            latencies, wall = await run_concurrent(target, calls, per_round, load.callers, warmup)
            concurrent[name] += latencies
            walls[name] += wall
    return {
        name: {
            "sequential": _summary(sequential[name], sum(sequential[name])),
            "concurrent": _summary(concurrent[name], walls[name]),
        }
        for name in targets
    }
