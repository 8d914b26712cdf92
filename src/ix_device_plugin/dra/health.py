"""Device health for the kubelet: the DRAResourceHealth service (v1 and v1alpha1) on the DRA socket.

`DeviceHealthBoard` holds each slice device's health as the hardware monitor last saw it; every stream the
kubelet opens (`NodeWatchResources`) gets the whole list at once, again within a moment of any change, and
again every RESEND_INTERVAL so that the kubelet never takes a quiet stream for a dead one. The kubelet shows
it in the pod's `status.containerStatuses[].allocatedResourcesStatus`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from ix_device_plugin.dra.slices import SliceContent

RESEND_INTERVAL = 20.0  # seconds between full lists on a quiet stream (the bound is 30 s)
HEALTH_TIMEOUT = 60  # seconds after the last update before the kubelet calls a device's health unknown


@dataclass(frozen=True)
class DeviceHealthState:
    """One device's health and why (empty when healthy)."""

    healthy: bool
    message: str = ""


class DeviceHealthBoard:
    """The health of every slice device; `update` from the monitor's views, streams read it."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.devices: dict[str, DeviceHealthState] = {}
        self.changes = 0  # health transitions seen (for the metrics)
        self.sent = 0  # messages sent on every stream together
        self._news = asyncio.Event()

    def update(self, content: SliceContent) -> None:
        """Take the devices of content; streams are woken when any device's health changed."""
        devices = {
            device.name: DeviceHealthState(device.healthy, "; ".join(device.reasons)) for device in content.devices
        }
        if devices == self.devices:
            return
        before = self.devices
        self.changes += sum(1 for name, state in devices.items() if name in before and before[name] != state)
        self.devices = devices
        woken, self._news = self._news, asyncio.Event()
        woken.set()

    async def watch(self, pb2: Any, stop: asyncio.Event) -> AsyncIterator[Any]:
        """The kubelet's stream in API module pb2: the whole list now, on each change, and every RESEND_INTERVAL."""
        while not stop.is_set():
            news = self._news
            yield self._message(pb2)
            self.sent += 1
            waiters = {asyncio.ensure_future(news.wait()), asyncio.ensure_future(stop.wait())}
            try:
                await asyncio.wait(waiters, timeout=RESEND_INTERVAL, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    def _message(self, pb2: Any) -> Any:
        now = int(time.time())
        return pb2.NodeWatchResourcesResponse(
            devices=[
                pb2.DeviceHealth(
                    device=pb2.DeviceIdentifier(pool_name=self.pool, device_name=name),
                    health=pb2.HEALTHY if state.healthy else pb2.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=HEALTH_TIMEOUT,
                    message=state.message,
                )
                for name, state in sorted(self.devices.items())
            ]
        )


class HealthService:
    """NodeWatchResources in one API version (its generated module pb2)."""

    def __init__(self, board: DeviceHealthBoard, pb2: Any, stop: asyncio.Event) -> None:
        self._board = board
        self._pb2 = pb2
        self._stop = stop

    async def NodeWatchResources(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """Every device's health, now and whenever it changes, until the kubelet or the driver ends the stream."""
        async for message in self._board.watch(self._pb2, self._stop):
            yield message
