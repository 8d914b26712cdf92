"""The process skeleton both front ends run on: start raced against a stop, supervised tasks, signals, a bounded stop.

A front end composes one `Service`: `run(start, shutdown)` starts it, waits for SIGTERM/SIGINT (or `stop()`),
then shuts it down within its budget. Background work runs as supervised tasks: a task that fails is logged
with its error and started again after a growing delay, and `down()` tells the probes while it is down.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ix_device_plugin.runtime import earlystop
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.memory import release_free_memory

log = logging.getLogger(__name__)

TaskFactory = Callable[[], Coroutine[Any, Any, None]]
RESTART_FIRST = 0.5  # seconds before a failed task is started again; doubled each time, up to RESTART_CAP
RESTART_CAP = 30.0
HEALTHY_RUN = 60.0  # a task that ran this long before failing starts its restart delays from the first again


class Supervised:
    """One background task, started again whenever it fails."""

    def __init__(self, name: str, factory: TaskFactory) -> None:
        self.name = name
        self._factory = factory
        self.failure: str | None = None  # why it is down, while it waits to start again
        self.restarts = 0
        self.task = asyncio.create_task(self._supervise(), name=name)

    async def _supervise(self) -> None:
        backoff = Backoff(initial=RESTART_FIRST, cap=RESTART_CAP, jitter=0.0)
        while True:
            started = time.monotonic()
            error: Exception | None = None
            try:
                await self._factory()
            except asyncio.CancelledError:
                raise
            except Exception as failure:
                error = failure
            if time.monotonic() - started > HEALTHY_RUN:
                backoff.reset()
            delay = backoff.next_delay()
            if error is not None:
                self.failure = f"{type(error).__name__}: {error}"
                log.error(
                    "task %s failed: %s; starting it again in %.1fs", self.name, self.failure, delay, exc_info=error
                )
            else:
                self.failure = "it returned"
                log.error("task %s ended; starting it again in %.1fs", self.name, delay)
            await asyncio.sleep(delay)
            self.restarts += 1
            self.failure = None
            log.info("task %s started again", self.name)


class Service:
    """Runs one front end: its start, its supervised tasks and its bounded stop."""

    def __init__(self, stop_timeout: float) -> None:
        self.stop_timeout = stop_timeout
        self._stopping = asyncio.Event()
        self._tasks: dict[str, Supervised] = {}

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """Ask the service to stop (safe to call from a signal handler)."""
        self._stopping.set()

    def install_signal_handlers(self, on_hangup: Callable[[], None] | None = None) -> None:
        """SIGTERM and SIGINT stop the service; SIGHUP calls on_hangup when given."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop)
        loop.add_signal_handler(signal.SIGINT, self.stop)
        if on_hangup is not None:
            loop.add_signal_handler(signal.SIGHUP, on_hangup)
        if earlystop.caught():
            log.info("SIGTERM received while starting: stopping")
            self.stop()

    async def run(self, start: Callable[[], Awaitable[None]], shutdown: Callable[[], Awaitable[None]]) -> int:
        """start(), then serve until stop(); shutdown() always runs. The process exit code.

        A stop during start-up (a slow discovery) does not wait for it. A StartupError is logged line by line;
        any other failure of start() is logged with its traceback; both exit 1.
        """
        starting = asyncio.create_task(start(), name="start")
        stop = asyncio.create_task(self._stopping.wait(), name="stop-request")
        await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if not starting.done():
            starting.cancel()
        elif (error := starting.exception()) is not None:
            if isinstance(error, StartupError):
                for line in str(error).splitlines():
                    log.error("%s", line)
            else:
                log.error("internal failure while starting; stopping", exc_info=error)
            code = 1
        else:
            release_free_memory()  # what start-up freed goes back to the system, not kept for months unused
            await stop
        stop.cancel()
        await shutdown()
        return code

    def spawn(self, name: str, factory: TaskFactory) -> None:
        """Run factory() as a supervised task called name."""
        self._tasks[name] = Supervised(name, factory)

    def down(self) -> list[str]:
        """`name: why` for every supervised task that is down now."""
        return [f"task {name} down ({task.failure})" for name, task in self._tasks.items() if task.failure]

    async def stop_tasks(self, timeout: float) -> None:
        """Cancel every supervised task and wait for them, at most timeout seconds."""
        tasks = dict(self._tasks)
        self._tasks.clear()
        for supervised in tasks.values():
            supervised.task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait([s.task for s in tasks.values()], timeout=timeout)
        for name, supervised in tasks.items():
            if supervised.task in pending:
                log.error("task %s did not stop in time; abandoning it", name)


async def bounded(what: str, work: Awaitable[Any], timeout: float) -> None:
    """Await work for at most timeout seconds; past that, log that it was abandoned."""
    try:
        async with asyncio.timeout(timeout):
            await work
    except TimeoutError:
        log.error("%s took longer than %.1fs; abandoning it", what, timeout)
