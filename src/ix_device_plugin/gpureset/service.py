"""The node's GPU reset service as its users hold it.

The reset's machinery (sequence.py, the handshake and its document) is loaded and built at its first use.

Most nodes never reset a chip: self-healing and `flags.reset_gpu` off, and no API access whose reset handshake must
be kept in order at start. There the machinery is never loaded (about 0.2 MiB of the device plugin's memory). A
configuration reloaded to turn a reset on builds it at that moment, as it was built at start before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ix_device_plugin.gpureset.sequence import Check, GpuReset, Turn
    from ix_device_plugin.runtime.backoff import Backoff


class ResetService:
    """Resets chips through the GpuReset that build() makes at the first reset or handshake record; node_turn: the
    node's reset turn, shared by every pod of the agent (the same one build() hands the GpuReset)."""

    def __init__(self, build: Callable[[], GpuReset], node_turn: Turn) -> None:
        self._build = build
        self._built: GpuReset | None = None
        self.node_turn = node_turn

    def _machinery(self) -> GpuReset:
        if self._built is None:
            self._built = self._build()
        return self._built

    @property
    def built(self) -> bool:
        """True once a reset or the handshake's record needed the machinery."""
        return self._built is not None

    @property
    def command_running(self) -> bool:
        """True while ixsmi (the backend's reset) runs."""
        return self._built is not None and self._built.command_running

    async def problem(self) -> str | None:
        """Why no reset can work here as the agent is deployed; None when one can (GpuReset.problem)."""
        return await self._machinery().problem()

    async def reset(self, uuids: Sequence[str], check: Check | None = None) -> None:
        """Reset these chips and rediscover (GpuReset.reset)."""
        await self._machinery().reset(uuids, check)

    async def settled(self) -> None:
        """Once the resets under way are over (GpuReset.settled); at once when none ever ran."""
        if self._built is not None:
            await self._built.settled()

    async def keep_record(self, backoff: Backoff, announce: Callable[[], bool] = lambda: True) -> None:
        """Keep the reset handshake's ConfigMap in order, for ever (GpuReset.keep_record)."""
        await self._machinery().keep_record(backoff, announce)

    def want_record(self) -> None:
        """Say in the ConfigMap that we hold the GPUs (GpuReset.want_record): a GpuReset not built yet says it
        when keep_record first runs."""
        if self._built is not None:
            self._built.want_record()

    async def close(self, timeout: float) -> None:
        """On stop: end a reset under way and never leave reset: true behind (GpuReset.close); nothing to do when
        none was ever built."""
        if self._built is not None:
            await self._built.close(timeout)
