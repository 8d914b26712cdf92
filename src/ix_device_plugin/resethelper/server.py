"""The helper's server: one request per connection, one reset at a time, every wait bounded.

A reset goes: can this process reset at all (hardware/resetaccess.py), is another reset running (busy), is the
rate limit reached, is the UUID one of this node's chips (the helper enumerates them itself through the backend,
then closes it so that its IXML lets go before ixsmi), then `ixsmi -r -i <uuid>` on a thread of its own. While it
runs, the connection is watched: a client that goes away, or a SIGTERM not followed by ixsmi's end within
STOP_GRACE, sets the abort that kills ixsmi's process group. The one-at-a-time state is held until ixsmi's thread
has returned, never only until an answer was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ix_device_plugin.hardware.backend import Backend, BackendError
from ix_device_plugin.hardware.ixml.reset import DRAIN, POLL, run_ixsmi_reset
from ix_device_plugin.hardware.resetaccess import local_reset_problem
from ix_device_plugin.hardware.resetprotocol import (
    CANNOT_RESET,
    FAILED,
    MAX_REQUEST,
    OK,
    REFUSED,
    Answer,
    ProtocolError,
    ResetRequest,
    format_answer,
    parse_request,
)
from ix_device_plugin.hardware.worker import Hardware

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 5.0  # a client sends its one line at once
WRITE_TIMEOUT = 5.0
DISCOVER_TIMEOUT = 30.0  # enumerating the chips (IXML's init included)
CLOSE_TIMEOUT = 10.0  # letting go of IXML before ixsmi runs
STOP_GRACE = 10.0  # on SIGTERM, how long a running ixsmi may go on before it is killed
KILL_GRACE = POLL + DRAIN + 2.0  # from abort to run_ixsmi_reset's return: one look, the kill, the drain
MAX_CONNECTIONS = 32  # open at once; more are answered busy at once
WINDOW = 60.0  # the rate limit's, seconds


@dataclass(frozen=True)
class HelperConfig:
    """What the server needs: where the backend comes from and how a reset runs."""

    backend_factory: Callable[[], Backend]
    drivers_dir: Path  # the sysfs directory a reset writes (resetaccess.reset_drivers_dir)
    ixsmi_path: str
    reset_timeout: float
    max_resets_per_minute: int


class RateLimit:
    """At most `limit` resets started within any WINDOW seconds."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._starts: deque[float] = deque()

    def retry_in(self) -> float:
        """0 when a reset may start now; else the seconds until one may."""
        now = self._clock()
        while self._starts and self._starts[0] <= now - WINDOW:
            self._starts.popleft()
        return 0.0 if len(self._starts) < self.limit else self._starts[0] + WINDOW - now

    def started(self) -> None:
        self._starts.append(self._clock())


class ResetHelper:
    """Serves the protocol on a listening socket until stop() (SIGTERM)."""

    def __init__(self, config: HelperConfig, listening: socket.socket) -> None:
        self.config = config
        self._listening = listening
        self._rate = RateLimit(config.max_resets_per_minute)
        self._resetting: str | None = None  # the UUID whose ixsmi thread has not returned
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopping = asyncio.Event()
        self._connections = 0
        self._answering: set[asyncio.Task[None]] = set()  # connections that asked for a reset
        self._problem: str | None = None

    def stop(self) -> None:
        """Stop accepting; a running reset may end within STOP_GRACE, then it is killed."""
        self._stopping.set()

    async def serve(self) -> int:
        """Serve until stop(); 0 once any running reset has ended."""
        self._problem = local_reset_problem(self.config.drivers_dir)
        if self._problem is not None:
            log.error("this helper cannot reset chips: %s; every reset is refused", self._problem)
        server = await asyncio.start_unix_server(self._handle, sock=self._listening, limit=MAX_REQUEST)
        log.info("reset helper listening (one reset at a time, at most %d a minute)", self._rate.limit)
        await self._stopping.wait()
        server.close()
        if self._resetting is not None:
            log.info("stopping: the reset of %s may end within %gs, then its ixsmi is killed", self._resetting,
                     STOP_GRACE)  # fmt: skip
        try:
            async with asyncio.timeout(STOP_GRACE + KILL_GRACE):
                await self._idle.wait()
        except TimeoutError:
            log.error("the reset of %s did not end after its ixsmi was killed; exiting all the same", self._resetting)
        if self._answering:  # the client of the last reset is told how it ended
            await asyncio.wait(self._answering, timeout=WRITE_TIMEOUT)
        log.info("reset helper stopped")
        return 0

    def problem(self) -> str | None:
        """Why this process cannot reset chips, or None; a change since the last look is logged."""
        problem = local_reset_problem(self.config.drivers_dir)
        if problem != self._problem:
            log.warning("%s", f"this helper cannot reset chips now: {problem}" if problem else "can reset chips again")
        self._problem = problem
        return problem

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        try:
            if self._connections > MAX_CONNECTIONS:
                answer = Answer(REFUSED, f"busy: {MAX_CONNECTIONS} connections are open")
            else:
                answer = await self._answer(reader)
            writer.write(format_answer(answer))
            async with asyncio.timeout(WRITE_TIMEOUT):
                await writer.drain()
        except (OSError, TimeoutError):
            pass  # the client went away: nothing to tell it
        finally:
            self._connections -= 1
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> Answer:
        try:
            request = parse_request(await _read_request(reader))
        except ProtocolError as error:
            log.warning("refused a malformed request: %s", error)
            return Answer(REFUSED, f"malformed request: {error}")
        if not isinstance(request, ResetRequest):
            return self._status()
        if (task := asyncio.current_task()) is not None:
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
        started = time.monotonic()
        answer = await self._reset(request.uuid, reader)
        level = logging.INFO if answer.kind == OK else logging.WARNING
        log.log(level, "reset of %s: %s after %.1fs: %s", request.uuid, answer.kind, time.monotonic() - started,
                answer.text)  # fmt: skip
        return answer

    def _status(self) -> Answer:
        if (problem := self.problem()) is not None:
            return Answer(REFUSED, f"{CANNOT_RESET}: {problem}")
        return Answer(OK, "ready" if self._resetting is None else f"ready; resetting {self._resetting}")

    async def _reset(self, uuid: str, reader: asyncio.StreamReader) -> Answer:
        """Every check, then the reset; the busy state is taken before the first wait, so no second one slips in."""
        if (problem := self.problem()) is not None:
            return Answer(REFUSED, f"{CANNOT_RESET}: {problem}")
        if self._resetting is not None:
            return Answer(REFUSED, f"busy: resetting {self._resetting}")
        if self._stopping.is_set():
            return Answer(REFUSED, "the reset helper is stopping")
        if (wait := self._rate.retry_in()) > 0:
            return Answer(REFUSED, f"rate-limited: {self._rate.limit} resets in the last minute; retry in {wait:.0f}s")
        self._resetting = uuid
        self._idle.clear()
        thread_started = False
        try:
            if (refusal := await self._unknown(uuid)) is not None:
                return refusal
            if self._stopping.is_set():  # asked to stop while the chips were enumerated: ixsmi is not started
                return Answer(REFUSED, "the reset helper is stopping")
            self._rate.started()
            thread_started = True
            return await self._run_ixsmi(uuid, reader)
        finally:
            if not thread_started:
                self._done()

    def _done(self) -> None:
        self._resetting = None
        self._idle.set()

    async def _unknown(self, uuid: str) -> Answer | None:
        """A refusal when uuid is not a chip the backend finds now (or it cannot enumerate them); else None."""
        hardware = Hardware(self.config.backend_factory, DISCOVER_TIMEOUT)
        try:
            inventory = await hardware.call("discover", lambda backend: backend.discover())
        except BackendError as error:
            return Answer(REFUSED, f"cannot enumerate this node's chips: {error}")
        finally:
            await hardware.close(CLOSE_TIMEOUT)  # IXML lets go before ixsmi runs
        known = sorted(chip.uuid for chip in inventory.chips())
        if uuid not in known:
            return Answer(REFUSED, f"unknown chip {uuid}: this node's chips are {', '.join(known) or 'none'}")
        return None

    async def _run_ixsmi(self, uuid: str, reader: asyncio.StreamReader) -> Answer:
        """ixsmi on its own thread, aborted when the client goes away or a stop outlasts STOP_GRACE."""
        abort = threading.Event()
        finished = _in_thread(self._ixsmi, uuid, abort)
        finished.add_done_callback(lambda _: self._done())
        gone = asyncio.ensure_future(_closed(reader))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            async with asyncio.timeout(self.config.reset_timeout + STOP_GRACE + KILL_GRACE):
                await asyncio.wait({finished, gone, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if gone.done() and not finished.done():
                    log.warning("the client asking to reset %s went away: killing ixsmi", uuid)
                    abort.set()
                elif stopping.done() and not finished.done():
                    await asyncio.wait({finished}, timeout=STOP_GRACE)
                    abort.set()
                return await asyncio.shield(finished)
        except TimeoutError:
            abort.set()
            return Answer(FAILED, f"ixsmi for {uuid} did not return in time")
        finally:
            gone.cancel()
            stopping.cancel()

    def _ixsmi(self, uuid: str, abort: threading.Event) -> Answer:
        """The fixed command, blocking (on its own thread): run_ixsmi_reset kills its process group at the deadline
        or on abort."""
        config = self.config
        try:
            run_ixsmi_reset(config.ixsmi_path, [uuid], config.reset_timeout, abort)
        except BackendError as error:
            return Answer(FAILED, str(error))
        return Answer(OK, f"reset {uuid}")


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """The request line as sent (parse_request judges it); ProtocolError when none comes in time or it is over the
    reader's limit without a newline."""
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT):
            return await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise ProtocolError(f"the request is over {MAX_REQUEST} bytes") from None
    except asyncio.IncompleteReadError as error:
        return error.partial  # closed before a newline: parse_request names that
    except TimeoutError:
        raise ProtocolError(f"no request line within {REQUEST_TIMEOUT:g}s") from None


async def _closed(reader: asyncio.StreamReader) -> None:
    """Returns when the client has closed its end (anything it sends after its request is ignored)."""
    while await reader.read(MAX_REQUEST):
        pass


def _in_thread(
    work: Callable[[str, threading.Event], Answer], uuid: str, abort: threading.Event
) -> asyncio.Future[Answer]:
    """work(uuid, abort) on a daemon thread of its own (a hung one never keeps the process from exiting)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Answer] = loop.create_future()

    def settle(answer: Answer | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(answer)  # type: ignore[arg-type]

    def run() -> None:
        try:
            answer, error = work(uuid, abort), None
        except BaseException as caught:  # handed to the awaiting task
            answer, error = None, caught
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, answer, error)

    threading.Thread(target=run, name=f"ixsmi-{uuid}", daemon=True).start()
    return future
