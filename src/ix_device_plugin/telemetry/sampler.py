"""GPU telemetry passes: every chip sampled in the background, one backend pass for all.

Labelled with the containers holding them, and handed to the collector whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.telemetry import ChipHolders, ChipSample
from ix_device_plugin.hardware.backend import Backend, BackendError
from ix_device_plugin.hardware.worker import BackendTimeout, Hardware
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.telemetry.collector import TelemetryCollector

log = logging.getLogger(__name__)


Holders = Callable[[], Awaitable[ChipHolders]]  # chip UUID -> the containers holding it (empty: unknown)


class TelemetrySampler:
    """Samples every chip each interval and hands the figures, with the containers holding each chip, to the
    collector.

    hardware: a worker of telemetry's own, over a backend instance of its own, so that a read that hangs
    holds up neither health nor the liveness probe: the pass fails at its deadline, the worker gives up on it
    (at most MAX_ABANDONED times; each leaves a thread behind), and the next pass leaves that figure out.
    """

    MAX_ABANDONED = 8

    def __init__(
        self,
        hardware: Hardware,
        collector: TelemetryCollector,
        interval: float,
        inventory: Callable[[], Inventory],
        holders: Holders,
    ) -> None:
        self._hardware = hardware
        self._collector = collector
        self._interval = interval
        self._inventory = inventory
        self._holders = holders
        self._turn = asyncio.Lock()  # a pass, or a pause

    async def run(self) -> None:
        """One pass per interval until cancelled; a failed pass is said once and leaves the last figures."""
        errors = OncePerError(log, logging.WARNING)
        while True:
            seen = self._inventory()
            if seen.boards:
                try:
                    samples = await self._sample(seen)
                except BackendError as error:
                    errors.failed("telemetry pass failed: %s", self._given_up(error))
                else:
                    errors.succeeded("telemetry passes work again")
                    holders = await self._holders()
                    self._collector.update(samples, self._inventory(), holders)
            await asyncio.sleep(self._interval)

    async def _sample(self, inventory: Inventory) -> Mapping[str, ChipSample]:
        async with self._turn:
            return await self._hardware.call("sample", lambda backend: backend.sample(inventory))

    def _given_up(self, error: BackendError) -> str:
        """Why the pass failed; a pass that hung is given up on, so that the next one runs."""
        if not isinstance(error, BackendTimeout):
            return str(error)
        if self._hardware.abandoned >= self.MAX_ABANDONED:
            return f"{error}; {self._hardware.abandoned} calls never returned, telemetry stops until a restart"
        self._hardware.abandon()
        return f"{error}; the next pass leaves out what it was reading"

    async def close(self, timeout: float) -> None:
        """Release telemetry's backend (not while a read hangs in it), within timeout."""
        await self._hardware.close(timeout)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """No pass while inside, and telemetry's hold on the GPU library released first (a GPU reset)."""
        async with self._turn:
            try:
                await self._hardware.call("release", _release)
            except BackendError as error:
                log.warning("telemetry could not release the GPU library before a reset: %s", error)
            yield


def _release(backend: Backend) -> None:
    backend.close()  # the next pass opens the library again
