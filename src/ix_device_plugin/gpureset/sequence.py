"""Resetting chips before a container gets them.

`flags.reset_gpu` in plugin mode (the chips behind an Allocate), `reset: true` in a DRA claim's GpuConfig (the
claim's chips, before the prepare is answered).

Other IXML users on the node (ix-exporter) are asked to let go first through Iluvatar's handshake
(handshake.py, on the ConfigMap document of document.py). A reset is a small state machine, one step at a time and
each step bounded:

    idle -> releasing (others asked to let go) -> resetting (ixsmi) -> returning (GPUs handed back)
         -> rediscovering -> idle

A failed step calls the rest off and hands the GPUs back (reset: false); if even that cannot be written,
it is retried in the background until it is. A reset that has started goes on to its end even when the
kubelet gives up on the Allocate; a stop waits for a running ixsmi (RESET_STOP_WAIT, then kills it) before
saying reset: false, so that no one takes the GPUs back in the middle of a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ix_device_plugin.apiserver.errors import KubeError
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.gpureset.document import CONFIG_MAP_PREFIX, DATA_KEY, OUR_NAME, ResetInfo
from ix_device_plugin.gpureset.handshake import ResetHandshake
from ix_device_plugin.gpureset.outcome import CANCELLED, KILL_WAIT, RESET_STOP_WAIT, UNAVAILABLE, GpuResetError
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.resetpath import ResetRefusedNow, ResetUnavailable
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.logs import OncePerError

if TYPE_CHECKING:
    from ix_device_plugin.hardware.worker import Hardware
    from ix_device_plugin.runtime.backoff import Backoff
    from ix_device_plugin.settings.options import NodeOptions

__all__ = [
    "CONFIG_MAP_PREFIX",
    "DATA_KEY",
    "KILL_WAIT",
    "OUR_NAME",
    "RESET_STOP_WAIT",
    "GpuReset",
    "GpuResetError",
    "ResetHandshake",
    "ResetInfo",
    "ResetSettings",
]

log = logging.getLogger(__name__)


@dataclass
class ResetSettings:
    """How long each step may take."""

    wait_timeout: float = 60.0  # each handshake step, and the rediscovery
    command_timeout: float = 120.0  # ixsmi -r

    @classmethod
    def of(cls, options: NodeOptions) -> ResetSettings:
        """The timeouts --reset-wait-timeout and --reset-timeout give."""
        return cls(wait_timeout=options.reset_wait_timeout, command_timeout=options.reset_timeout)


Turn = Callable[[], contextlib.AbstractAsyncContextManager[None]]  # entered around a step that others must wait out
HandshakeSource = Callable[[], Awaitable[ResetHandshake | None]]
Check = Callable[[], Awaitable[None]]  # the caller's last look before ixsmi; GpuResetError calls the reset off


class ResetMetrics(Protocol):
    """Where resets are counted: a counter of resets by result, and a histogram of their durations."""

    gpu_resets: Any
    gpu_reset_duration: Any


class GpuReset:
    """Resets chips one request at a time, with the handshake when the API server is reachable."""

    def __init__(
        self,
        hardware: Hardware,
        handshake: HandshakeSource,
        rediscover: Callable[[], Awaitable[Inventory]],
        metrics: ResetMetrics,
        settings: ResetSettings,
        *,
        node_turn: Turn | None = None,
        quiet_others: Turn | None = None,
    ) -> None:
        self._hardware = hardware
        self._handshake_source = handshake
        self._rediscover = rediscover
        self._metrics = metrics
        self._settings = settings
        self._turn = asyncio.Lock()
        self._handshake: ResetHandshake | None = None
        self._announced = False
        self._work: set[asyncio.Task[None]] = set()
        self._command: asyncio.Task[Any] | None = None
        self._abort = threading.Event()
        self._record_wanted = asyncio.Event()  # the ConfigMap must (again) say reset: false, we hold the GPUs
        self._record_wanted.set()
        # Our other users of the GPU library (telemetry) let go of it while ixsmi runs.
        self.quiet_others: Turn = quiet_others or _nothing_to_quiet
        # The node's turn to reset, where other processes reset the same GPUs (another pod of the agent during an
        # update): keep_record takes it before saying reset: false, so that it never ends another's reset.
        # It raises OutputError when the turn cannot be had in time.
        self.node_turn: Turn = node_turn or _nothing_to_quiet

    @property
    def command_running(self) -> bool:
        """True while ixsmi (the backend's reset) runs."""
        return self._command is not None and not self._command.done()

    async def reset(self, uuids: Sequence[str], check: Check | None = None) -> None:
        """Reset these chips and rediscover; GpuResetError (with what Allocate should answer) when that fails.

        check, when given, is the caller's last look, awaited after the other IXML users let go and immediately
        before ixsmi: a GpuResetError it raises calls the reset off (nothing is reset, the GPUs are handed back).
        The reset goes on to its end (the GPUs handed back) even when the caller is cancelled.
        """
        work = asyncio.create_task(self._reset_in_turn(list(uuids), check), name="gpu-reset")
        self._work.add(work)
        work.add_done_callback(self._ended)
        await asyncio.shield(work)

    async def settled(self) -> None:
        """Once the resets under way are over (a caller cancelled in the middle of one waits here, so that what it
        holds while a reset runs is held until ixsmi is done; close() bounds that at a stop)."""
        if self._work:
            await asyncio.wait(list(self._work))

    def _ended(self, work: asyncio.Task[None]) -> None:
        self._work.discard(work)
        if not work.cancelled():
            work.exception()  # retrieved: the caller, if still there, got it

    async def _reset_in_turn(self, uuids: list[str], check: Check | None) -> None:
        async with self._turn:
            started, result = time.monotonic(), "failed"
            try:
                await self._steps(uuids, check)
                result = "ok"
            except GpuResetError as error:
                result = CANCELLED if self._abort.is_set() else error.result  # set: the stop killed its ixsmi
                raise
            except asyncio.CancelledError:  # the stop called it off (close)
                result = CANCELLED
                raise
            finally:
                seconds = time.monotonic() - started
                self._metrics.gpu_resets.labels(result=result).inc()
                self._metrics.gpu_reset_duration.observe(seconds)
                log.info("GPU reset of %s: %s after %.1fs", ",".join(uuids), result, seconds)

    async def problem(self) -> str | None:
        """Why no reset can work here as the agent is deployed (hardware/resetpath.py); None when one can."""
        try:
            return await self._hardware.call("reset_problem", lambda backend: backend.reset_problem())
        except BackendError as error:
            return f"whether a reset can work here could not be told: {error}"

    async def _steps(self, uuids: list[str], check: Check | None) -> None:
        problem = await self.problem()  # first: a reset that cannot work asks no one to let go
        if problem is not None:
            raise GpuResetError(f"the GPU reset is unavailable here: {problem}; the GPUs were not reset", UNAVAILABLE)
        handshake = await self._opened()
        if handshake is not None:
            try:
                await handshake.hold_off(self._settings.wait_timeout)
            except (GpuResetError, KubeError) as error:
                await self._hand_back(handshake)
                raise GpuResetError(f"{_refusal(error)}; the GPUs were not reset", "refused") from None
        if check is not None:
            try:
                await check()
            except BaseException:
                if handshake is not None:
                    await self._hand_back(handshake)
                raise
        try:
            async with self.quiet_others():
                failure = await self._run_command(uuids)
        except Exception:  # not the reset's own failure (those are returned): the GPUs are handed back all the same
            if handshake is not None:
                await self._hand_back(handshake)
            raise
        late: list[str] = []
        if handshake is not None:
            late = await self._hand_back(handshake)
        if failure is not None:
            raise failure
        _check_uuids(uuids, await self._rediscovered())
        if late and handshake is not None:
            raise GpuResetError(
                f"the GPUs were reset, but {', '.join(late)} let go of them for it and did not take them back within "
                f"{self._settings.wait_timeout:g}s ({handshake.where}); the kubelet's request fails so that it "
                "tries again, and later resets do not wait for it until it takes the GPUs back"
            )

    async def _opened(self) -> ResetHandshake | None:
        """The handshake, said at its first use (we hold the GPUs); None without API access."""
        if self._handshake is None:
            self._handshake = await self._handshake_source()
            if self._handshake is None:
                return None
        if not self._announced:
            try:
                await self._handshake.announce(self._settings.wait_timeout)
            except KubeError as error:
                raise GpuResetError(
                    f"the reset handshake failed: {error}; the GPUs were not reset", "refused"
                ) from None
            except GpuResetError as error:  # the API server answered: what it holds is wrong, not the connection
                raise GpuResetError(
                    f"the reset handshake cannot start: {error}; the GPUs were not reset", "refused"
                ) from None
            self._announced = True
            self._record_wanted.clear()
        return self._handshake

    async def _run_command(self, uuids: list[str]) -> GpuResetError | None:
        """ixsmi for uuids, in a task of its own that a stop can wait for; why it failed, or None."""
        timeout, abort = self._settings.command_timeout, threading.Event()
        self._abort = abort

        def work(backend: Any) -> None:
            backend.reset(uuids, timeout, abort)

        self._command = asyncio.ensure_future(self._hardware.call("reset", work, timeout=timeout + 5))
        try:
            await self._command
        except ResetUnavailable as error:
            return GpuResetError(f"the GPU reset is unavailable here: {error}; the GPUs were not reset", UNAVAILABLE)
        except ResetRefusedNow as error:
            return GpuResetError(f"the reset helper did not reset {','.join(uuids)} now: {error}", "refused")
        except BackendError as error:
            return GpuResetError(f"resetting {','.join(uuids)} failed: {error}")
        return None

    async def _hand_back(self, handshake: ResetHandshake) -> list[str]:
        """reset: false and our occupy true; the users that did not come back. A failure here must not hide the
        reset's own outcome: it is logged and retried in the background until it succeeds."""
        try:
            return await handshake.welcome_back(self._settings.wait_timeout)
        except (GpuResetError, KubeError) as error:
            log.error("could not end the GPU reset in %s: %s; retrying", handshake.where, error)
            self._record_wanted.set()
            return []

    async def _rediscovered(self) -> Inventory:
        try:
            async with asyncio.timeout(self._settings.wait_timeout):
                return await self._rediscover()
        except TimeoutError:
            raise GpuResetError(
                f"the chips were not discovered again within {self._settings.wait_timeout:g}s after the reset"
            ) from None

    async def keep_record(self, backoff: Backoff, announce: Callable[[], bool] = lambda: True) -> None:
        """At start, and whenever handing the GPUs back failed: say in the ConfigMap that we hold them (reset:
        false), trying again until it is said; for ever (cancel to stop).

        announce() false (no feature resets at Allocate, only self-healing may): at start only a reset: true left by
        an earlier process is ended; the ConfigMap is not made, and our entry is said at the first reset.
        """
        errors = OncePerError(log)
        while True:
            await self._record_wanted.wait()
            try:
                async with self.node_turn(), self._turn:
                    handshake = await self._repaired() if not self._announced and not announce() else None
                    if handshake is None:
                        handshake = await self._opened()
                        if handshake is not None and handshake.resetting:
                            await handshake.announce(self._settings.wait_timeout)
                self._record_wanted.clear()
                errors.succeeded("GPU reset handshake: %s is in order again", handshake.where if handshake else "")
                backoff.reset()
            except (GpuResetError, KubeError, OutputError) as error:
                errors.failed("GPU reset handshake: %s; retrying", error)
                await backoff.sleep()

    def want_record(self) -> None:
        """Say in the ConfigMap that we hold the GPUs (flags.reset_gpu was turned on): keep_record does it."""
        if not self._announced:
            self._record_wanted.set()

    async def _repaired(self) -> ResetHandshake | None:
        """End a reset: true left behind, without making the ConfigMap; the handshake (None without API access)."""
        if self._handshake is None:
            self._handshake = await self._handshake_source()
        handshake = self._handshake
        if handshake is not None and await handshake.repair(self._settings.wait_timeout):
            log.info("%s said reset: true, left by a reset cut short; it says reset: false again", handshake.where)
        return handshake

    async def close(self, timeout: float) -> None:
        """On stop: wait for a running ixsmi (RESET_STOP_WAIT, then it is killed), then say reset: false within
        timeout; never leave reset: true behind."""
        command = self._command
        if command is not None and self.command_running:
            log.warning(
                "stopping during a GPU reset: waiting up to %gs for it to end before saying it is over", RESET_STOP_WAIT
            )
            await asyncio.wait([command], timeout=RESET_STOP_WAIT)
            if not command.done():
                self._abort.set()
                await asyncio.wait([command], timeout=KILL_WAIT)
        work = list(self._work)
        for task in work:
            task.cancel()
        if work:
            await asyncio.wait(work, timeout=timeout)
        handshake = self._handshake
        if handshake is None or not handshake.resetting:
            return
        try:
            async with asyncio.timeout(timeout):
                await handshake.announce(timeout)
            log.info("GPU reset cut short by the stop; %s says reset: false again", handshake.where)
        except Exception as error:
            why = str(error) or (
                f"the API server did not answer within {timeout:g}s"
                if isinstance(error, TimeoutError)
                else type(error).__name__
            )
            log.error(
                "could not end the GPU reset in %s before stopping: %s; the next start ends it", handshake.where, why
            )


@contextlib.asynccontextmanager
async def _nothing_to_quiet() -> AsyncIterator[None]:
    """Nothing to wait for or to quiet (no one else uses the GPUs in this process, or resets them on this node)."""
    yield


def _refusal(error: Exception) -> str:
    return f"the reset handshake failed: {error}" if isinstance(error, KubeError) else str(error)


def _check_uuids(uuids: list[str], inventory: Inventory) -> None:
    present = {chip.uuid for chip in inventory.chips() if chip.status.present}
    changed = [uuid for uuid in uuids if uuid not in present]
    if changed:
        raise GpuResetError(
            f"after the reset the node no longer lists {', '.join(changed)} (a new UUID?); "
            "the kubelet retries with the devices as they are now",
            "uuid_changed",
        )
