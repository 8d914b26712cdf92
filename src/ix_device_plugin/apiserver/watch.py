"""`Mirror`: a local copy of the objects a selector picks, kept current by one watch request at a time.

A Mirror reads the objects once (a LIST, or a GET of one named object), then watches from the
resourceVersion of that read, so that nothing between the two is missed. Every end of a watch, whatever
its kind (an error, 410 Expired, a clean end), waits out a delay of the connection's backoff policy before
the next request; the backoff starts again from its first delay only after a watch has lived HEALTHY_FOR.
A watch that lived that long and ended cleanly (the API server's own timeout) is resumed from the last
resourceVersion seen; any other end reads the objects again (one log line says why), and a read that
finds what was last delivered delivers nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

from ix_device_plugin.apiserver.errors import KubeError, KubeExpired, KubeNotFound
from ix_device_plugin.apiserver.objects import Object, ObjectKind, version_of
from ix_device_plugin.apiserver.settings import KubeConfigError
from ix_device_plugin.runtime.logs import OncePerError

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.client import Kube
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.runtime.backoff import Backoff

log = logging.getLogger(__name__)

T = TypeVar("T")
Key = tuple[str, str]  # (namespace, name)

HEALTHY_FOR = 30.0  # seconds a watch must live for its end to be a normal one (no re-read, backoff from the start)
MAX_ITEMS = 10_000  # objects a Mirror keeps at most: a node's pods are a few hundred; more is not a real server


class Mirror(Generic[T]):
    """The objects of one kind that a selector picks (or one named object), as `convert` makes them, kept current.

    `run()` is the only writer; `items` is replaced whole at each change, and `changed()` wakes whoever waits.
    """

    def __init__(
        self,
        api: ApiConnection,
        kind: ObjectKind,
        convert: Callable[[Object], T],
        what: str,
        *,
        namespace: str | None = None,
        name: str | None = None,
        field_selector: Mapping[str, str] | None = None,
        backoff: Backoff | None = None,
        healthy_for: float = HEALTHY_FOR,
        on_change: Callable[[Mapping[Key, T]], None] | None = None,
        max_items: int = MAX_ITEMS,
    ) -> None:
        self.api = api
        self.kind = kind
        self.what = what
        self.backoff = backoff or api.backoff()
        self.items: Mapping[Key, T] = {}
        self.synced = False  # items have been read at least once
        self.generation = 0  # bumped at each change of items
        self.problem = ""  # why items may be out of date now ("" when they are not)
        self._convert = convert
        self._namespace = namespace
        self._name = name
        self._fields = dict(field_selector or {})
        if name is not None:
            self._fields["metadata.name"] = name
        self._healthy_for = healthy_for
        self._max_items = max_items
        self._on_change = on_change
        self._version = ""
        self._news = asyncio.Event()
        self._errors = OncePerError(log, logging.WARNING)

    @property
    def news(self) -> asyncio.Event:
        """An event set at the next change of items (or the first read)."""
        return self._news

    async def changed(self, timeout: float | None = None) -> bool:
        """Wait until items change (or the first read is done); False when timeout passed first."""
        news = self._news
        try:
            async with asyncio.timeout(timeout):
                await news.wait()
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        """Read, then watch, for ever (cancel to stop): every failure is logged once and waited out."""
        read = True
        while True:
            started = time.monotonic()
            problem = await self._read_and_watch(read)
            if time.monotonic() - started >= self._healthy_for:  # it lived: the next delay is the first again
                self.backoff.reset()
            if problem is None:
                self._errors.succeeded("%s: watching again", self.what)
            else:
                self.problem = problem
                self._errors.failed("%s: %s; reading it again", self.what, problem)
            read = problem is not None
            await self.backoff.sleep()

    async def _read_and_watch(self, read: bool) -> str | None:
        """One read (when asked) and one watch; None when the watch lived long and ended cleanly, else why not."""
        try:
            kube = await self.api.kube()
            if read:
                await self._read(kube)
            started = time.monotonic()
            await self._watch(kube)
        except KubeExpired:  # the message names versions: a fixed text is logged once, not at every 410
            return "the API server no longer keeps the history to resume the watch (410 Expired)"
        except (KubeError, KubeConfigError) as error:
            return str(error)
        except Exception as error:  # a bug in a library must not stop the plugin: report it and go on
            return f"{type(error).__name__}: {error}"
        if time.monotonic() - started < self._healthy_for:
            return f"the watch ended within {self._healthy_for:g}s"
        return None

    async def _read(self, kube: Kube) -> None:
        """List what is followed (a named object by its name), keeping the list's resourceVersion to watch from.

        Never a named object's own resourceVersion: an object unchanged for longer than the watch history the
        API server keeps (after its restart, a compaction) would be answered 410 Expired at every watch.
        """
        objects, version = await kube.list_with_version(self.kind, self._namespace, field_selector=self._fields)
        if self._name is not None and not objects:
            what = f"list {self.kind.describe(self._name, self._namespace)}"
            raise KubeNotFound(f"{what}: HTTP 404 NotFound: no such {self.kind.kind.lower()}", 404, "NotFound")
        self._version = version
        self._deliver({_key(obj): self._convert(obj) for obj in objects})

    async def _watch(self, kube: Kube) -> None:
        events = kube.watch(self.kind, self._version, namespace=self._namespace, field_selector=self._fields)
        async with contextlib.aclosing(events):
            async for change, obj in events:
                self._version = version_of(obj) or self._version
                if change in ("ADDED", "MODIFIED"):
                    self._deliver({**self.items, _key(obj): self._convert(obj)})
                elif change == "DELETED":
                    self._deliver({key: item for key, item in self.items.items() if key != _key(obj)})

    def _deliver(self, items: Mapping[Key, T]) -> None:
        if len(items) > self._max_items:
            raise KubeError(f"the API server sent more than {self._max_items:,} objects; none kept")
        self.problem = ""
        if self.synced and items == self.items:
            return
        self.items, self.synced = items, True
        self.generation += 1
        woken, self._news = self._news, asyncio.Event()
        woken.set()
        if self._on_change is not None:
            self._on_change(items)


def _key(obj: Mapping[str, object]) -> Key:
    metadata = obj.get("metadata") or {}
    assert isinstance(metadata, Mapping)
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))
