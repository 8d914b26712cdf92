"""The hardware monitor: the one place that asks the hardware what is there and how it is.

It owns the node's `HardwareView` (the inventory, every chip with its current status) and changes it from
four inputs, one at a time in its own task: health polls every health interval, rediscovery every rediscover
interval or soon after a hint (a `/dev/iluvatar*` node came or went, a chip fell off the bus, a reset), XID
events from the backend's own thread, and the first discovery at start. Both front ends subscribe: each change
is handed to every subscriber, which turns it into its own state (ListAndWatch health, ResourceSlice taints,
the DRA health stream), so what one mode learns of the hardware the other learns too.

A chip keeps a critical XID until the process restarts or a reset clears it (`clear_xids`, after the healer reset the
chip), at most MAX_XIDS of them (one is enough to make it Unhealthy); a chip that vanished from enumeration stays in
its board as not present until it is back. XID events that change nothing (an application XID, one ignored, one on a
chip not served, one already kept) are logged once and then summarised (how many, the last when), so that a storm of
them stays a few lines. Every backend call goes through the deadlined `Hardware` worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from ix_device_plugin.core.inventory import ChipStatus, Ignored, Inventory, carry_missing, xid_ignored
from ix_device_plugin.hardware.backend import Backend, BackendError, XidEvent
from ix_device_plugin.hardware.devnodes import with_control_nodes
from ix_device_plugin.hardware.requests import ClearXids, Overlay, Rediscover, Request
from ix_device_plugin.hardware.view import HardwareView, MonitorSettings, Subscriber
from ix_device_plugin.hardware.worker import Hardware
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.filewatch import Watcher
from ix_device_plugin.runtime.logs import OncePerError, Repeats

log = logging.getLogger(__name__)

XidListener = Callable[[XidEvent], None]

SETTLE = 0.2  # let a burst of hot-plug events settle before rediscovering
MAX_XIDS = 16  # distinct XIDs kept per chip; past that the chip is Unhealthy already, and the rest are counted
XID_SUMMARY_INTERVAL = 60.0  # seconds between two summaries of the same repeated XID event
GPU_NODE_PREFIXES = ("iluvatar", "itrctl")  # /dev entries whose coming and going means rediscover


class HardwareMonitor:
    """Discovery, health polls, XID events and hot-plug on one worker, handed to every subscriber."""

    def __init__(
        self,
        hardware: Hardware,
        settings: MonitorSettings,
        on_xid: Callable[[int], None] | None = None,
        on_poll: Callable[[], None] | None = None,
        ignored: Callable[[], Ignored] | None = None,
    ) -> None:
        self.hardware = hardware
        self.settings = settings
        self.view = HardwareView(Inventory())
        self._ignored = ignored or (lambda: frozenset())  # the health policy in force: XIDs it ignores are not kept
        self._subscribers: list[Subscriber] = []
        self._xid_listeners: list[XidListener] = []
        self._requests: asyncio.Queue[Request] = asyncio.Queue()
        self._on_xid = on_xid or (lambda xid: None)
        self._on_poll = on_poll or (lambda: None)
        self._last_good_poll = time.monotonic()
        self._health_errors = OncePerError(log)
        self._discovery_errors = OncePerError(log)
        self.xid_log = Repeats(log, XID_SUMMARY_INTERVAL)
        # What the agent lays over the chips' own health, applied to every status published:
        self._held_out: dict[str, str] = {}  # chip UUID -> why it is kept out of service (reserved for a reset)
        self._care: dict[str, str] = {}  # chip UUID -> what self-healing does about it (ChipStatus.care)
        self._followed_xids: dict[str, frozenset[int]] = {}  # XIDs another pod of the agent saw (its record)
        self._own_xids: dict[str, frozenset[int]] = {}  # chip UUID -> the XIDs this process keeps for it
        self._xid_seen: dict[tuple[str, int], float] = {}  # (chip UUID, XID kept) -> when it was last reported
        self.xids_watched = False

    # ---- what the front ends use ------------------------------------------------------------

    @property
    def inventory(self) -> Inventory:
        """The inventory as last seen."""
        return self.view.inventory

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call subscriber with every new view, on the event loop, in the order of the changes."""
        self._subscribers.append(subscriber)

    def listen_xids(self, listener: XidListener) -> None:
        """Call listener with every XID event on a chip the node serves, ignored ones too, as it arrives."""
        self._xid_listeners.append(listener)

    async def clear_xids(self, uuid: str, xids: frozenset[int], before: float | None = None) -> HardwareView:
        """After a reset of the chip: read every chip's health again, then forget these XIDs of it, except one
        reported again at or after `before` (monotonic: when the reset started; it is still pending, the reset did
        not clear it); the view once every subscriber has been handed it."""
        done: asyncio.Future[HardwareView] = asyncio.get_running_loop().create_future()
        self._requests.put_nowait(ClearXids(uuid, xids, done, before))
        return await done

    def reported_since(self, uuid: str, since: float) -> frozenset[int]:
        """The chip's kept XIDs reported (again) at or after since (monotonic)."""
        return frozenset(xid for (chip, xid), when in self._xid_seen.items() if chip == uuid and when >= since)

    async def xids_live(self, uuid: str) -> bool | None:
        """Whether the chip's XID events are being waited for now (after a reset: the event set registered again);
        None when the backend has no XID events at all. BackendError."""
        watched = await self.hardware.call("xids_watched", lambda backend: backend.xids_watched())
        return None if watched is None else uuid in watched

    def preset(self, *, followed_xids: Mapping[str, frozenset[int]], held_out: Mapping[str, str]) -> None:
        """Before start: what the node-health record says, laid over the chips from the first discovery on: another
        pod's XIDs until adopt_followed (see follow_xids), and the chips held out of service (see hold_out)."""
        self._set_followed(followed_xids)
        self._set_held_out(held_out)

    async def hold_out(self, held: Mapping[str, str]) -> HardwareView:
        """Keep exactly these chips (UUID -> why) out of service, whatever their health reads; the view once every
        subscriber has been handed it."""
        return await self._overlay(lambda: self._set_held_out(held))

    def show_care(self, care: Mapping[str, str]) -> None:
        """Say what self-healing does about each chip out of service (ChipStatus.care), without waiting."""
        done: asyncio.Future[HardwareView] = asyncio.get_running_loop().create_future()
        self._requests.put_nowait(Overlay(lambda: setattr(self, "_care", dict(care)), done))

    def ask_hold_out(self, held: Mapping[str, str]) -> None:
        """hold_out without waiting for it to be published (a release)."""
        done: asyncio.Future[HardwareView] = asyncio.get_running_loop().create_future()
        self._requests.put_nowait(Overlay(lambda: self._set_held_out(held), done))

    async def follow_xids(self, xids: Mapping[str, frozenset[int]]) -> HardwareView:
        """Lay these XIDs (another pod's, from the node-health record) over the chips' own; replaces the last ones.
        adopt_followed makes them this process's own."""
        return await self._overlay(lambda: self._set_followed(xids))

    async def adopt_followed(self) -> HardwareView:
        """The XIDs followed so far become this process's own (it takes over the node's role)."""

        def adopt() -> None:
            followed, self._followed_xids = self._followed_xids, {}
            self._own_xids.update(followed)

        return await self._overlay(adopt)

    async def _overlay(self, change: Callable[[], None]) -> HardwareView:
        done: asyncio.Future[HardwareView] = asyncio.get_running_loop().create_future()
        self._requests.put_nowait(Overlay(change, done))
        return await done

    def _set_held_out(self, held: Mapping[str, str]) -> None:
        self._held_out = dict(held)

    def _set_followed(self, xids: Mapping[str, frozenset[int]]) -> None:
        self._followed_xids = {uuid: frozenset(found) for uuid, found in xids.items() if found}

    async def start(self, fail_on_init_error: bool, xids: bool = True) -> HardwareView:
        """Ask for XID events (unless xids is false: see watch_xids), then discover; StartupError when that fails
        and fail_on_init_error is set.

        Otherwise a failed first discovery leaves an empty view, retried every rediscover interval.
        """
        if xids:
            await self.watch_xids()
        try:
            inventory = await self._discover()
        except BackendError as error:
            self._discovery_errors.failed("GPU discovery failed: %s", error)
            if fail_on_init_error:
                raise StartupError(
                    "no GPUs could be discovered; exiting (set flags.failOnInitError: false to keep "
                    "running with 0 GPUs and retry every minute)"
                ) from None
            log.warning("continuing with 0 GPUs; retrying discovery every %gs", self.settings.rediscover_interval)
            return self.view
        self._take_discovery(inventory)
        return self.view

    async def rediscover(self) -> HardwareView:
        """Discover now (after a GPU reset); the view once every subscriber has been handed it. BackendError."""
        done: asyncio.Future[HardwareView] = asyncio.get_running_loop().create_future()
        self._requests.put_nowait(Rediscover(done))
        return await done

    def hint_rediscover(self) -> None:
        """Rediscover soon (something suggests the chips changed)."""
        self._requests.put_nowait(Rediscover())

    def problem(self) -> str | None:
        """Why the hardware side is not live (a call stuck in the library, no good poll for long), else None."""
        stuck = self.hardware.stuck_for()
        if stuck is not None:
            return f"GPU library call {stuck[0]}() has not returned for {stuck[1]:.0f}s"
        if self.view.discovered:
            age = time.monotonic() - self._last_good_poll
            if age > self.settings.health_stale_after:
                return f"no successful health poll for {age:.0f}s"
        return None

    async def run(self) -> None:
        """Poll, rediscover and take XID events until cancelled."""
        watcher = Watcher() if self.settings.watch_dev else None
        dev_task = asyncio.create_task(self._follow_dev(watcher), name="dev-watch") if watcher else None
        try:
            await self._serve_requests()
        finally:
            if dev_task is not None:
                dev_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await dev_task
            if watcher is not None:
                watcher.close()

    # ---- the monitor's own task ---------------------------------------------------------------

    async def _serve_requests(self) -> None:
        settings = self.settings
        next_poll = time.monotonic() + settings.health_interval
        next_discovery = time.monotonic() + settings.rediscover_interval
        while True:
            request = await self._next_request(min(next_poll, next_discovery))
            self.xid_log.flush()
            now = time.monotonic()
            if isinstance(request, XidEvent):
                self._take_xid(request)
            elif isinstance(request, ClearXids):
                await self._clear_xids(request)
            elif isinstance(request, Overlay):
                self._take_overlay(request)
            elif isinstance(request, Rediscover) or now >= next_discovery:
                if request is not None and request.done is None:
                    await asyncio.sleep(SETTLE)
                    self._drop_hints()
                await self._rediscover(request.done if request else None)
                next_discovery = time.monotonic() + settings.rediscover_interval
            elif now >= next_poll:
                await self._poll()
                next_poll = time.monotonic() + settings.health_interval

    async def _next_request(self, deadline: float) -> Request | None:
        """The next request, or None when deadline (monotonic) passes first."""
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                return await self._requests.get()
        except TimeoutError:
            return None

    def _drop_hints(self) -> None:
        """Forget rediscovery hints queued meanwhile (the discovery about to run covers them); keep the rest."""
        kept = []
        while not self._requests.empty():
            request = self._requests.get_nowait()
            if not (isinstance(request, Rediscover) and request.done is None):
                kept.append(request)
        for request in kept:
            self._requests.put_nowait(request)

    async def _rediscover(self, done: asyncio.Future[HardwareView] | None) -> None:
        try:
            inventory = await self._discover()
        except BackendError as error:
            self._discovery_errors.failed("GPU discovery failed: %s", error)
            if done is not None and not done.done():
                done.set_exception(BackendError(str(error)))
            return
        self._take_discovery(inventory)
        if done is not None and not done.done():
            done.set_result(self.view)

    async def _poll(self) -> None:
        if not self.view.discovered:
            return
        polled = self.view.inventory
        if not polled.boards:
            return
        current = polled.statuses()
        try:
            statuses = await self.hardware.call("health", lambda backend: backend.health(polled))
        except BackendError as error:
            self._health_errors.failed("health check failed for every chip: %s", error)
            problem = f"health check failed: {error}"
            statuses = {chip.uuid: ChipStatus(problems=(problem,)) for chip in polled.chips()}
        else:
            self._health_errors.succeeded("health checks answer again")
            self._last_good_poll = time.monotonic()
            self._on_poll()
            if any(not status.present and _was_present(current.get(uuid)) for uuid, status in statuses.items()):
                self.hint_rediscover()  # once per loss: a chip kept as absent is looked for at the rediscovery interval
        kept = {uuid: self._overlaid(uuid, status) for uuid, status in statuses.items()}
        if all(current.get(uuid) == status for uuid, status in kept.items()):
            return  # nothing changed (most polls, on a healthy node)
        self._publish(polled.with_statuses(kept), self.view.discovered)

    def _take_discovery(self, inventory: Inventory) -> None:
        self._discovery_errors.succeeded()
        previous = self.view.inventory
        carried = carry_missing(previous, inventory)
        carried = carried.with_statuses({chip.uuid: self._overlaid(chip.uuid, chip.status) for chip in carried.chips()})
        if not self.view.discovered:
            self._note_first_discovery(carried)
        elif _chip_set(carried) != _chip_set(previous):
            log.info("GPU inventory changed: %d -> %d chips", previous.chip_count(), carried.chip_count())
        if carried != previous or not self.view.discovered:
            self._publish(carried, True)

    def _note_first_discovery(self, inventory: Inventory) -> None:
        log.info(
            "found %d boards, %d chips (driver %s)",
            len(inventory.boards),
            inventory.chip_count(),
            inventory.driver_version or "unknown",
        )
        self._last_good_poll = time.monotonic()

    def _take_overlay(self, request: Overlay) -> None:
        request.change()
        inventory = self.view.inventory
        statuses = {chip.uuid: self._overlaid(chip.uuid, chip.status) for chip in inventory.chips()}
        if any(chip.status != statuses[chip.uuid] for chip in inventory.chips()):
            self._publish(inventory.with_statuses(statuses), self.view.discovered)
        if not request.done.done():
            request.done.set_result(self.view)

    def _overlaid(self, uuid: str, status: ChipStatus) -> ChipStatus:
        """status as published: with the XIDs kept for the chip (a poll or rediscovery does not clear them) and
        those another pod saw; held out when the agent holds it out."""
        xids = self._own_xids.get(uuid, frozenset()) | self._followed_xids.get(uuid, frozenset())
        return replace(status, xids=xids, held_out=self._held_out.get(uuid, ""), care=self._care.get(uuid, ""))

    async def _clear_xids(self, request: ClearXids) -> None:
        await self._poll()
        chip = next((chip for chip in self.view.inventory.chips() if chip.uuid == request.uuid), None)
        cleared = frozenset(
            xid for xid in request.xids
            if request.before is None or self._xid_seen.get((request.uuid, xid), 0.0) < request.before
        )  # fmt: skip
        if chip is not None and chip.status.xids & cleared:
            for kept in (self._own_xids, self._followed_xids):
                if request.uuid in kept:
                    kept[request.uuid] = kept[request.uuid] - cleared
            for xid in cleared:
                self._xid_seen.pop((request.uuid, xid), None)
            status = self._overlaid(chip.uuid, chip.status)
            self._publish(self.view.inventory.with_statuses({chip.uuid: status}), self.view.discovered)
        if not request.done.done():
            request.done.set_result(self.view)

    def _take_xid(self, event: XidEvent) -> None:
        """A critical XID: the chip is Unhealthy from now on (unless the XID is ignored), until a reset clears it."""
        self._on_xid(event.xid)
        chip = next((chip for chip in self.view.inventory.chips() if chip.uuid == event.uuid), None)
        if chip is None:
            self.xid_log.log(logging.INFO, "XID %d on %s, a chip not served now; ignored", event.xid, event.uuid[:80])
            return
        for listener in self._xid_listeners:
            listener(event)
        if xid_ignored(event.xid, self._ignored()):
            self.xid_log.log(
                logging.INFO,
                "XID %d on %s ignored (an application XID, or listed in IX_DISABLE_HEALTHCHECKS)",
                event.xid,
                chip.uuid,
            )
            return
        own = self._own_xids.get(chip.uuid, frozenset())
        if event.xid in own:
            self._xid_seen[(chip.uuid, event.xid)] = time.monotonic()  # reported again: after a reset, still pending
            return  # the same XID again: the chip is Unhealthy already
        if len(own) >= MAX_XIDS:
            self.xid_log.log(
                logging.WARNING,
                "more XIDs on %s: it is Unhealthy with %d XIDs kept already; the others are counted, not kept",
                chip.uuid,
                MAX_XIDS,
            )
            return
        log.warning(
            "XID %d on %s: a critical error; the chip is Unhealthy until a reset clears it", event.xid, chip.uuid
        )
        self._own_xids[chip.uuid] = own | {event.xid}
        self._xid_seen[(chip.uuid, event.xid)] = time.monotonic()
        status = self._overlaid(chip.uuid, chip.status)
        self._publish(self.view.inventory.with_statuses({chip.uuid: status}), self.view.discovered)

    def _publish(self, inventory: Inventory, discovered: bool) -> None:
        self.view = HardwareView(inventory, self.view.version + 1, discovered)
        for subscriber in self._subscribers:
            subscriber(self.view)

    # ---- inputs -------------------------------------------------------------------------------

    async def _discover(self) -> Inventory:
        inventory = await self.hardware.call("discover", lambda backend: backend.discover())
        return with_control_nodes(inventory, self.settings.dev_root)

    async def watch_xids(self) -> None:
        """Ask the backend to hand XID events to the monitor, once; without them, health comes from polling alone.

        A pod on standby behind another pod of the agent asks for none until it acts for the node: the acting pod
        sees every XID (the library may hand each to one listener) and the standby learns them from its record."""
        if self.xids_watched:
            return
        self.xids_watched = True
        loop = asyncio.get_running_loop()

        def sink(event: XidEvent) -> None:  # runs on the backend's event thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process has stopped
                loop.call_soon_threadsafe(self._requests.put_nowait, event)

        def watch(backend: Backend) -> None:
            backend.watch_xids(sink)

        try:
            await self.hardware.call("watch_xids", watch)
        except BackendError as error:  # the backend cannot be opened: discovery says why
            log.debug("no XID events: %s", error)

    async def _follow_dev(self, watcher: Watcher) -> None:
        """Hint a rediscovery when a GPU's /dev node comes or goes (what udev does on hot-plug)."""
        dev_dir = self.settings.dev_root / "dev"
        watcher.watch(dev_dir)
        while True:
            changed = await watcher.wait(self.settings.rediscover_interval)
            if any(path.parent == dev_dir and path.name.startswith(GPU_NODE_PREFIXES) for path in changed):
                self.hint_rediscover()


def _was_present(status: ChipStatus | None) -> bool:
    return status is None or status.present


def _chip_set(inventory: Inventory) -> frozenset[str]:
    return frozenset(chip.uuid for chip in inventory.chips() if chip.status.present)
