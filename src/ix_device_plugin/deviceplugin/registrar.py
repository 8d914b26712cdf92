"""The registration state machine: register with the kubelet when asked, retry with capped backoff.

`request()` asks for a (new) registration: after the endpoint (re)starts or the kubelet
restarts. Only the newest request counts: an answer to an older attempt, arriving after
the kubelet restarted again, does not make the plugin registered. While kubelet.sock does
not exist the registrar waits for it; that is not a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ix_device_plugin.deviceplugin.metrics import Metrics
from ix_device_plugin.kubelet.registration import KUBELET_SOCKET, RegistrationError, register
from ix_device_plugin.kubelet.sockets import Identity, identity
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

# How long a registration waits for the kubelet to open the ListAndWatch of the socket it has just registered (it
# dials, asks the options, answers, and only then opens the stream) before registering that socket again.
FOLLOW_WAIT = 2.0
BACKOFF_START = 0.05  # seconds before the first retry of a failed registration, doubled each time
BACKOFF_MAX = 5.0
# Kubelet 1.37's refusal of a socket it already has an endpoint for. It then forgets its client of that socket but
# keeps the endpoint, so every later registration of the socket is refused the same way while the first connection
# goes on serving (pkg/kubelet/cm/devicemanager: manager.PluginConnected, handler.connectClient).
ALREADY_CONNECTED = "device plugin already connected"


@dataclass(frozen=True)
class Success:
    """The last registration the kubelet answered: kubelet.sock as seen before and after it (one of them was
    dialed), the endpoint's socket it named, and when it began (time.monotonic())."""

    kubelet: frozenset[Identity | None]
    ours: Identity | None
    began: float


class Registrar:
    """Keeps the endpoint registered for the resource name resource_name() gives at each attempt."""

    def __init__(
        self,
        plugin_dir: Path,
        endpoint: str,
        resource_name: Callable[[], str],
        metrics: Metrics,
        poll_interval: float = 1.0,
        followed: Callable[[float], bool] | None = None,
    ) -> None:
        self._plugin_dir = plugin_dir
        self._followed = followed  # True while a kubelet follows the endpoint on a stream opened since (monotonic)
        self._endpoint = endpoint
        self._resource_name = resource_name
        self._metrics = metrics
        self._poll_interval = poll_interval
        self._requested = 0  # bumped by every request
        self._registered_for = 0  # the request the last success answered
        self._ever_registered = False
        self._kick = asyncio.Event()
        self._failing_since: float | None = None
        self._errors = OncePerError(log, logging.WARNING)
        self._waiting_logged = False
        self._attempting_with: Identity | None = None  # the kubelet.sock of the attempt under way
        self._last_success: Success | None = None
        self._kubelet_seen = identity(plugin_dir / KUBELET_SOCKET)  # as files_changed last saw it
        self._backoff = Backoff(initial=BACKOFF_START, cap=BACKOFF_MAX)

    @property
    def registered(self) -> bool:
        """True when the newest request has been answered by the kubelet."""
        return self._requested > 0 and self._registered_for == self._requested

    def failing_for(self) -> float | None:
        """Seconds registration has been failing, None when it is not."""
        return None if self._failing_since is None else time.monotonic() - self._failing_since

    def request(self) -> None:
        """Register (again) as soon as possible, waking any backoff."""
        self._requested += 1
        self._kick.set()

    def files_changed(self, paths: frozenset[Path], serving: bool) -> None:
        """Register again when kubelet.sock was re-created (among paths, or seen with a new identity).

        Only while the endpoint is serving: a lost endpoint registers again once it serves anew.
        """
        kubelet = self._plugin_dir / KUBELET_SOCKET
        now = identity(kubelet)
        recreated = now is not None and (kubelet in paths or now != self._kubelet_seen)
        self._kubelet_seen = now
        if recreated and serving and now is not None and self.kubelet_restarted(now):
            log.info("kubelet restarted (%s re-created); registering again", kubelet)

    def kubelet_restarted(self, kubelet: Identity) -> bool:
        """Register with the kubelet whose socket is now `kubelet`, unless already registered with it; True if asked.

        Without inotify, the socket's disappearance and its re-creation can be seen in different polls,
        after a registration that already went to the new kubelet: that one is not repeated."""
        registered_with = self._last_success.kubelet if self._last_success is not None else frozenset()
        if (self.registered and kubelet in registered_with) or kubelet == self._attempting_with:
            return False
        self.request()
        return True

    async def run(self) -> None:
        """Serve requests forever (cancel to stop)."""
        while True:
            if self.registered or self._requested == 0:
                await self._sleep_until_kicked(None)
                continue
            kubelet = self._plugin_dir / KUBELET_SOCKET
            if not kubelet.exists():
                self._note_waiting(kubelet)
                await self._sleep_until_kicked(self._poll_interval)
                continue
            if not (self._plugin_dir / self._endpoint).exists():  # the endpoint asks again once it serves anew
                await self._sleep_until_kicked(self._poll_interval)
                continue
            if await self._kubelet_follows_this_socket():
                self._registered_for = self._requested
                continue
            if await self._attempt():
                self._backoff.reset()
            else:
                await self._sleep_until_kicked(self._backoff.next_delay())

    async def _kubelet_follows_this_socket(self) -> bool:
        """True when the kubelet serving kubelet.sock now may be the one the last registration went to (its socket
        as seen before or after that registration: a kubelet restarting replaces it while one is under way), the
        socket is the one it registered, and a kubelet follows its ListAndWatch on a stream opened since (waited for
        up to FOLLOW_WAIT): asked again meanwhile, by a kubelet restart and the endpoint's restart it caused, the
        answer is already in hand. Kubelet 1.37 refuses a second registration of a socket it follows, forgets its
        client of it, and from then on refuses that socket for good: the next process of the plugin would never be
        registered, and once another pod's socket goes, the kubelet may send its allocations to this lost one."""
        last = self._last_success
        if self._followed is None or last is None:
            return False
        kubelet, ours = self._sockets_now()
        if kubelet not in last.kubelet or ours != last.ours:
            return False
        followed = self._followed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FOLLOW_WAIT):
                while not followed(last.began):
                    await asyncio.sleep(0.05)
        return followed(last.began)

    def _sockets_now(self) -> tuple[Identity | None, Identity | None]:
        return identity(self._plugin_dir / KUBELET_SOCKET), identity(self._plugin_dir / self._endpoint)

    async def _attempt(self) -> bool:
        answering = self._requested
        self._kick.clear()
        name = self._resource_name()
        kubelet, ours = self._sockets_now()
        began = time.monotonic()
        self._attempting_with = kubelet
        try:
            await register(self._plugin_dir, self._endpoint, name)
        except RegistrationError as error:
            if not self._already_followed(error):
                return self._failed(error)
        finally:
            self._attempting_with = None
        seen = frozenset({kubelet, identity(self._plugin_dir / KUBELET_SOCKET)})  # the dial went to one of them
        self._last_success = Success(seen, ours, began)
        return self._succeeded(answering, name)

    def _already_followed(self, error: RegistrationError) -> bool:
        """True when the kubelet refused the registration as already connected and does follow the endpoint's
        ListAndWatch now: it has the plugin (a second registration of one socket, 20 ms after the first, was so
        refused after a kubelet restart, and every retry after it)."""
        if ALREADY_CONNECTED not in str(error) or self._followed is None or not self._followed(float("-inf")):
            return False
        log.info("the kubelet is already connected to %s and follows it: registered", self._endpoint)
        return True

    def _failed(self, error: RegistrationError) -> bool:
        self._metrics.registration_failures.inc()
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._errors.failed("%s; retrying with backoff up to %gs", error, BACKOFF_MAX)
        return False

    def _succeeded(self, answering: int, name: str) -> bool:
        self._failing_since = None
        self._errors.succeeded()
        self._waiting_logged = False
        if answering != self._requested:
            return True  # asked again meanwhile (the kubelet restarted): register with the new one
        self._registered_for = answering
        self._metrics.registrations.inc()
        if self._ever_registered:
            self._metrics.reregistrations.inc()
        self._ever_registered = True
        log.info("registered %s with the kubelet", name)
        return True

    def _note_waiting(self, kubelet: Path) -> None:
        if not self._waiting_logged:
            log.info("waiting for the kubelet to serve %s", kubelet)
            self._waiting_logged = True

    async def _sleep_until_kicked(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._kick.wait()
        self._kick.clear()
