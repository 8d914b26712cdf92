"""Critical XID events from IXML's event API (NVML's nvmlEventSet*), waited for in a thread of their own."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Mapping

from ix_device_plugin.hardware.backend import XidEvent, XidSink
from ix_device_plugin.hardware.ixml.library import (
    CALLS,
    HANDLE,
    NVML_ERROR_TIMEOUT,
    NVML_SUCCESS,
    CallError,
    EventData,
    Library,
)

log = logging.getLogger(__name__)

NVML_EVENT_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError; the event's data is the XID number
EVENT_WAIT_MS = 500  # one nvmlEventSetWait_v2 call waits at most this long, so the waiter stops promptly
EVENT_CALLS = ("event_set_create", "register_events", "event_wait", "event_set_free")


_Targets = tuple[tuple[int, str], ...]


def _targets(uuids: Mapping[int, str]) -> _Targets:
    return tuple(sorted(uuids.items()))


class XidWaiter:
    """A thread of its own that waits on one IXML event set and hands each critical XID to a sink.

    Each nvmlEventSetWait_v2 call waits at most EVENT_WAIT_MS, then the stop flag is checked, so
    stop() returns within about that long; the library is never shut down while a wait is under way.
    The wait runs without LIBRARY_LOCK (NVML's event wait may run alongside other calls).
    """

    def __init__(
        self, library: Library, event_set: HANDLE, uuids: Mapping[int, str], sink: XidSink, targets: _Targets
    ) -> None:
        self.targets = targets  # the devices asked for (uuids: those of them that support XID events)
        self.library = library
        self._set = event_set
        self._uuids = dict(uuids)
        self._sink = sink
        self._stop = threading.Event()
        self._last_problem = ""
        self._thread = threading.Thread(target=self._run, name="ix-xid-events", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def watched(self) -> frozenset[str]:
        """The chips whose XID events this waiter waits for."""
        return frozenset(self._uuids.values())

    def stop(self) -> bool:
        """Stop waiting and free the event set; False when the thread is still inside the library."""
        self._stop.set()
        self._thread.join(timeout=EVENT_WAIT_MS / 1000 + 1.0)
        if self._thread.is_alive():
            return False
        free_event_set(self.library, self._set)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            data = EventData()
            code = self.library.code("event_wait", self._set, ctypes.byref(data), EVENT_WAIT_MS)
            if code == NVML_ERROR_TIMEOUT:
                continue
            if code != NVML_SUCCESS:
                self._note(f"{self.library.symbol('event_wait')} failed: {self.library.error_string(code)}")
                self._stop.wait(EVENT_WAIT_MS / 1000)  # do not spin on a failing wait; polling still runs
                continue
            self._note("")
            if data.eventType & NVML_EVENT_XID_CRITICAL:
                self._deliver(data)

    def _deliver(self, data: EventData) -> None:
        uuid = self._uuids.get(data.device or 0)
        if uuid is None:
            log.warning("XID %d on a device IXML did not name; health polling covers it", data.eventData)
            return
        try:
            self._sink(XidEvent(uuid=uuid, xid=int(data.eventData)))
        except Exception as error:  # the sink's failure must not end the waiter
            log.warning("XID %d on %s was not handed on: %s", data.eventData, uuid, error)

    def _note(self, problem: str) -> None:
        """Log a new wait failure once, and its end once."""
        if problem == self._last_problem:
            return
        if problem:
            log.warning("XID events: %s; health polling goes on", problem)
        else:
            log.info("XID events arrive again")
        self._last_problem = problem


def free_event_set(library: Library, event_set: HANDLE) -> None:
    try:
        library.call("event_set_free", event_set)
    except CallError as exc:
        log.warning("XID events: %s", exc)


class XidWatch:
    """The backend's XID events: the sink, the one waiter, and what was already said about them.

    Called with LIBRARY_LOCK held.
    """

    def __init__(self) -> None:
        self.sink: XidSink | None = None
        self._waiter: XidWaiter | None = None
        self._unavailable_logged = False
        self._stuck = False  # a waiter that did not stop: the library is left initialised

    def hand_to(self, sink: XidSink) -> None:
        """From the next watch() on, hand each critical XID event to sink."""
        self.sink = sink

    def watch(self, library: Library, uuids: dict[int, str]) -> None:
        """Wait for XID events of these devices (handle -> UUID), again when they changed or the waiter stopped."""
        if self.sink is None:
            return
        targets = _targets(uuids)
        waiter = self._waiter
        if waiter is not None and waiter.alive and waiter.targets == targets:
            return
        if not self.stop():
            return
        missing = [CALLS[call][0][0] for call in EVENT_CALLS if not library.has(call)]
        if missing:
            self._note_unavailable(f"{library.path} lacks {', '.join(missing)}")
            return
        supported = dict(uuids)
        event_set = self._register(library, supported)
        if event_set is not None:
            self._waiter = XidWaiter(library, event_set, supported, self.sink, targets)

    def _register(self, library: Library, uuids: dict[int, str]) -> HANDLE | None:
        """A new event set with every device that supports XID events (uuids keeps only those); None if none."""
        event_set = HANDLE()
        try:
            library.call("event_set_create", ctypes.byref(event_set))
        except CallError as exc:
            self._note_unavailable(str(exc))
            return None
        unsupported = []
        for handle, uuid in list(uuids.items()):
            try:
                library.call("register_events", HANDLE(handle), NVML_EVENT_XID_CRITICAL, event_set)
            except CallError as exc:
                del uuids[handle]
                if exc.not_supported:
                    unsupported.append(uuid)
                else:
                    log.warning("XID events: %s: %s; that chip's health comes from polling only", uuid, exc)
        if unsupported:
            log.info("XID events are not supported on %s; health polling covers them", ", ".join(unsupported))
        if not uuids:
            free_event_set(library, event_set)
            self._note_unavailable(f"{library.symbol('register_events')} registers no chip")
            return None
        log.info("waiting for XID events of %d chips", len(uuids))
        return event_set

    def watched(self) -> frozenset[str] | None:
        """The chips the waiter waits for now (none while it is not running); None when the library has no XID
        events or no chip supports them."""
        if self._unavailable_logged and self._waiter is None:
            return None
        waiter = self._waiter
        if waiter is None or not waiter.alive:
            return frozenset()
        return waiter.watched

    def stop(self) -> bool:
        """Stop the XID waiter, if any; False when it did not stop (it is still inside the library)."""
        if self._stuck:
            return False
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.stop():
            return True
        self._stuck = True
        log.error(
            "the XID event waiter did not return from %s; IXML is left initialised and XID events stop "
            "(health polling goes on)",
            waiter.library.symbol("event_wait"),
        )
        return False

    def _note_unavailable(self, why: str) -> None:
        if not self._unavailable_logged:
            self._unavailable_logged = True
            log.warning("no IXML XID events (%s): chip health comes from polling alone", why)
