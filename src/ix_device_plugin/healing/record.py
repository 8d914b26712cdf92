"""The node-health record's file, `<kubelet plugins dir>/iluvatar.com/node-health.json`.

Shared by every pod of the agent on the node in either mode (the directory survives a reboot and the kubelet's
restarts, unlike the device-plugin socket directory and the CDI tmpfs).

One writer at a time: the pod holding the node's role (the healer that acts). Writes are atomic (temporary file,
fsync, rename), so a reader sees the old record or the new one. Every other pod reads it: at start, under the claims'
lock before a prepare (a chip reserved for a reset gets no claim), and on standby whenever it changes (inotify).

A record that cannot be used (malformed, a newer version, not a regular file) is named in the log, kept beside as
`node-health.json.unreadable-<time>` (a hard link: the original stays until a good record replaces it; the
ASIDE_KEPT newest such copies are kept, older ones removed) and not trusted in any part. A process that read or
wrote a good record before keeps it as what it knows (`known`): a record removed or spoiled by someone else makes
no pod forget a chip that needs an operator, and the pod acting for the node writes it again. A process that never
read one starts from the hardware as it reads now.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from ix_device_plugin.core.healthrecord import HealthRecord, RecordError, parse_record, record_text
from ix_device_plugin.runtime.files import (
    OutputError,
    keep_aside,
    kept_aside,
    reason,
    remove_oldest_aside,
    write_atomically,
)
from ix_device_plugin.runtime.filewatch import Watcher
from ix_device_plugin.settings.documents import DocumentError, read_file

log = logging.getLogger(__name__)

NODE_DIR = "iluvatar.com"  # beside the DRA driver's gpu.iluvatar.com, for both modes
RECORD_FILE = "node-health.json"
RECORD_LIMIT = 1024 * 1024
ASIDE_LABEL = "unreadable"
ASIDE_KEPT = 5  # unreadable versions kept aside: enough to see what spoiled it; a loop of bad writes fills no disk
FOLLOW_TICK = 30.0  # seconds: the watcher's timer; inotify wakes it at once


def record_path(kubelet_plugins_dir: Path) -> Path:
    """Where the record lives under the kubelet's plugins directory."""
    return kubelet_plugins_dir / NODE_DIR / RECORD_FILE


class RecordFile:
    """Reads and writes the record at path; remembers what it last read, so that an unchanged file is not parsed
    again (a prepare looks at it every time), and the last good record it read or wrote."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.unreadable = ""  # why the last read could not use the file ("" when it could)
        self.last_good: HealthRecord | None = None  # the last record read whole or written by this process
        self._seen: tuple[int, int, int] | None = None
        self._last: HealthRecord | None = None
        self._written = ""  # the text this process wrote last

    def known(self) -> HealthRecord | None:
        """What the node's record says as far as this process knows: the file now, or the last good record read or
        written when the file is gone or cannot be used (only the pod acting for the node may forget: it writes)."""
        return self.read() or self.last_good

    def reserved_now(self) -> dict[str, str]:
        """Chips reserved for a reset by any pod of the agent (chip UUID -> why), as known() says now."""
        record = self.known()
        return {} if record is None else record.reserved()

    def holds_written(self, found: HealthRecord | None) -> bool:
        """True when found, read from the file, is the record this process wrote last (a pod acting for the node
        checks that no one removed, spoiled or changed it)."""
        return found is not None and bool(self._written) and record_text(found) == self._written

    def read(self) -> HealthRecord | None:
        """The record now; None when there is none, or when it cannot be used (then kept aside and said)."""
        identity = _identity(self.path)
        if identity is None:
            self._seen, self._last, self.unreadable = None, None, ""
            return None
        if identity == self._seen:
            return self._last
        try:
            record = parse_record(read_file(self.path, RECORD_LIMIT, follow_symlinks=False).decode("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, DocumentError, UnicodeDecodeError, RecordError) as error:
            why = reason(error) if isinstance(error, OSError) else str(error)
            self._set_aside(why, identity)
            return None
        self._seen, self._last, self.unreadable, self.last_good = identity, record, "", record
        return record

    def write(self, record: HealthRecord) -> None:
        """Replace the record (atomically); OutputError naming the file."""
        text = record_text(record)
        write_atomically(self.path, text)
        self._seen, self._last, self.unreadable, self.last_good = _identity(self.path), record, "", record
        self._written = text

    def _set_aside(self, why: str, identity: tuple[int, int, int]) -> None:
        if identity == self._seen and self.unreadable:
            return  # said already
        self._seen, self._last = identity, None
        self.unreadable = f"{self.path}: {why}"
        try:
            aside = _aside_already(self.path, identity[0]) or keep_aside(self.path, ASIDE_LABEL)
        except OutputError as error:
            log.error("node-health record %s cannot be used: %s; not trusted, and %s", self.path, why, error)
            return
        for removed in remove_oldest_aside(self.path, ASIDE_LABEL, ASIDE_KEPT):
            log.info("node-health record: removed %s, older than the %d unreadable versions kept", removed, ASIDE_KEPT)
        log.error(
            "node-health record %s cannot be used: %s; kept as %s, not trusted: the chips start from what the "
            "hardware reads now",
            self.path, why, aside,
        )  # fmt: skip

    async def follow(self, changed: Callable[[HealthRecord | None], Awaitable[None]]) -> None:
        """Hand changed() the record whenever the file changes (inotify on its directory; a timer where inotify is
        not there), and once at the start; until cancelled."""
        watcher = Watcher()
        try:
            watcher.watch(self.path.parent)
            await changed(self.read())
            while True:
                paths = await watcher.wait(FOLLOW_TICK)
                if not paths or any(path == self.path or path == self.path.parent for path in paths):
                    await changed(self.read())
        finally:
            watcher.close()


def _aside_already(path: Path, inode: int) -> Path | None:
    """The copy kept aside of the file whose inode is inode (a hard link), if there is one: a file spoiled again in
    place is not linked again."""
    for aside in kept_aside(path, ASIDE_LABEL):
        with contextlib.suppress(OSError):
            if aside.lstat().st_ino == inode:
                return aside
    return None


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        found = path.lstat()
    except OSError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns)
