"""The backend behind one worker thread: every call has a deadline, and a hung call never holds up the daemon.

Backends are blocking (ctypes into libixml.so) and not meant to be called from two
threads at once, so calls run one at a time on a daemon thread. A call that does not
return in time is reported as failed; while it is still running, later calls fail at
once, naming it, and `stuck_for` tells the liveness probe. Callers take turns: one that
arrives while another call is within its deadline waits for it. The thread is a daemon
thread, so a library that never returns cannot keep the process from exiting.

A worker whose backend may be called from another thread while one call hangs (telemetry's, which reads
figures only) can `abandon()` a hung call: later calls run on a new thread, the hung one is left to itself.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ix_device_plugin.hardware.backend import Backend, BackendError

log = logging.getLogger(__name__)
T = TypeVar("T")
_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class BackendTimeout(BackendError):
    """A backend call did not return within its deadline."""


class Hardware:
    """Opens the backend on first use and runs each call on the worker thread, with a deadline."""

    def __init__(self, factory: Callable[[], Backend], timeout: float) -> None:
        self._factory = factory
        self.timeout = timeout
        self._backend: Backend | None = None
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # the current thread's
        self._thread: threading.Thread | None = None
        self.abandoned = 0  # hung calls given up on (each left a thread behind)
        self._running: tuple[str, float] | None = None  # (call name, started at)
        self._running_limit = timeout
        self._pending: asyncio.Future[Any] | None = None  # the future of the call under way
        self._turn = asyncio.Lock()

    @property
    def running(self) -> str | None:
        """The name of the call under way (not one given up on), if any."""
        return None if self._running is None else self._running[0]

    def stuck_for(self) -> tuple[str, float] | None:
        """(call name, seconds) of a call running past its deadline, else None."""
        running = self._running
        if running is None:
            return None
        name, started = running
        elapsed = time.monotonic() - started
        return (name, elapsed) if elapsed > self._running_limit else None

    async def call(self, name: str, work: Callable[[Backend], T], timeout: float | None = None) -> T:
        """work(backend) on the worker thread; raises BackendError, or BackendTimeout past the deadline
        (the backend timeout, unless this call has its own)."""

        def job() -> T:
            if self._backend is None:
                self._backend = self._factory()
            return work(self._backend)

        return await self._run(name, job, timeout)

    async def close(self, timeout: float) -> None:
        """Release the backend once the call under way (if any) returns; never waits longer than timeout."""
        deadline = time.monotonic() + timeout
        if self._running is not None and self._pending is not None:
            await asyncio.wait([self._pending], timeout=timeout)  # a call abandoned by a cancelled caller
        if self._backend is None or self._running is not None:
            self._stop_worker()
            return
        backend = self._backend
        self._backend = None
        try:
            await self._run("close", backend.close, timeout=max(0.05, deadline - time.monotonic()))
        except Exception as error:  # closing must not fail a stop
            log.warning("closing the GPU library: %s", error)
        self._stop_worker()

    def abandon(self) -> bool:
        """Give up on the call under way (it hung): later calls run on a new thread. False when none runs."""
        if self._running is None:
            return False
        self._running, self._pending = None, None
        self._stop_worker()  # the hung thread ends, if its call ever returns
        self._jobs = queue.SimpleQueue()
        self.abandoned += 1
        return True

    async def _run(self, name: str, job: Callable[[], T], timeout: float | None = None) -> T:
        async with self._turn:  # one call at a time; a caller waits at most for one deadline
            return await self._run_now(name, job, timeout)

    async def _run_now(self, name: str, job: Callable[[], T], timeout: float | None) -> T:
        if self._running is not None:
            raise BackendError(f"{name}: the previous backend call {self._running[0]}() has not returned")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        future.add_done_callback(_retrieve)  # an abandoned call's late error is not "never retrieved"
        limit = self.timeout if timeout is None else timeout
        self._running, self._running_limit = (name, time.monotonic()), limit
        self._pending = future
        self._ensure_worker()
        self._jobs.put((job, loop, future))
        try:
            async with asyncio.timeout(limit):
                return await asyncio.shield(future)
        except TimeoutError:
            raise BackendTimeout(f"backend call {name}() did not return within {limit:g}s") from None

    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, args=(self._jobs,), name="ix-backend", daemon=True)
            self._thread.start()

    def _stop_worker(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _work(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        while (item := jobs.get()) is not None:
            job, loop, future = item
            try:
                result: Any = job()
            except BaseException as error:  # handed to the awaiting task
                self._deliver(loop, future, error=error)
            else:
                self._deliver(loop, future, result=result)

    def _deliver(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
        result: Any = None,
        error: BaseException | None = None,
    ) -> None:
        def settle() -> None:
            if self._pending is future:  # not a call abandoned meanwhile: the running one is done
                self._running = None
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            if self._pending is future:
                self._running = None


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
