"""Waking up when files change: inotify where the kernel offers it, a timer always.

The watcher only decides *when* to look; callers decide what changed by
looking at the files themselves, so a missed or coalesced event costs at most
one poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

log = logging.getLogger(__name__)

try:
    from inotify_simple import INotify
    from inotify_simple import flags as inotify_flags
except ImportError:  # pragma: no cover - inotify_simple is a dependency; guard for odd platforms
    INotify = None  # type: ignore[assignment,misc]

_MASK_NAMES = (
    "CREATE",
    "DELETE",
    "MOVED_TO",
    "MOVED_FROM",
    "CLOSE_WRITE",
    "ATTRIB",
    "DELETE_SELF",
    "MOVE_SELF",
)


class Watcher:
    """Collects the names of entries created, removed or rewritten in a set of directories."""

    def __init__(self) -> None:
        self._inotify: INotify | None = None
        self._dirs: dict[int, Path] = {}
        self._lost: set[Path] = set()  # watched directories that were removed; watched again when back
        self._changed: set[Path] = set()
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def uses_inotify(self) -> bool:
        """True when kernel events wake the watcher; otherwise only the timer does."""
        return self._inotify is not None and bool(self._dirs)

    def watch(self, directory: Path) -> bool:
        """Start watching directory; False when events are unavailable for it (polling covers it)."""
        if INotify is None:
            return False
        if not directory.is_dir():
            self._lost.add(directory)  # watched once it exists
            return False
        try:
            if self._inotify is None:
                self._inotify = INotify(nonblocking=True)
                self._loop = asyncio.get_running_loop()
                self._loop.add_reader(self._inotify.fileno(), self._drain)
            mask = 0
            for name in _MASK_NAMES:
                mask |= getattr(inotify_flags, name)
            descriptor = self._inotify.add_watch(directory, mask)
        except OSError as error:
            log.info("inotify unavailable for %s (%s); polling instead", directory, error)
            return False
        self._dirs[descriptor] = directory
        return True

    def _drain(self) -> None:
        assert self._inotify is not None
        for event in self._inotify.read(timeout=0):
            directory = self._dirs.get(event.wd)
            if directory is None:
                continue
            self._changed.add(directory / event.name if event.name else directory)
            if event.mask & inotify_flags.IGNORED:  # the directory went away; its watch is gone
                del self._dirs[event.wd]
                self._lost.add(directory)
        self._event.set()

    def _rewatch_lost(self) -> None:
        for directory in list(self._lost):
            if directory.is_dir() and self.watch(directory):
                self._lost.discard(directory)
                self._changed.add(directory)

    async def wait(self, timeout: float) -> set[Path]:
        """Paths changed since the last call, returned at the first event or after timeout."""
        if not self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._event.wait()
        self._event.clear()
        self._rewatch_lost()
        changed, self._changed = self._changed, set()
        return changed

    def close(self) -> None:
        """Stop watching."""
        if self._inotify is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None
        self._dirs.clear()
