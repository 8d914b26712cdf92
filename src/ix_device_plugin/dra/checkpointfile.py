"""The checkpoint file of the DRA driver's prepared claims.

Read again only when another driver changed it, written atomically, and rebuilt from the claims' CDI specs when it
cannot be read (checkpoint.py holds its format).

A checkpoint that cannot be read, or is missing while claim specs are there, is rebuilt from the specs, at start
or while running: the rebuilt one is written before the old one is kept aside (checkpoint.json.corrupt-<Unix
time>); where it cannot be written (a full disk) the old one stays as it was and the rebuilt claims are served from
memory, rebuilt and written again at the next read, so that a full disk never stops a start (a path that can never
be written, a directory in its place, does). A spec that cannot be read is skipped with a message, never removed and
never a reason to forget the others. Used by `DraState` under its lock only.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Mapping
from pathlib import Path

from ix_device_plugin.dra.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    CheckpointTooNew,
    checkpoint_text,
    read_checkpoint,
)
from ix_device_plugin.dra.prepared import PreparedClaim
from ix_device_plugin.dra.specfiles import ClaimSpecFiles
from ix_device_plugin.runtime.files import OutputError, keep_aside, remove_oldest_aside, write_atomically

log = logging.getLogger(__name__)

ASIDE_LABEL = "corrupt"  # checkpoint.json.corrupt-<Unix time>: unreadable checkpoints kept for the operator
ASIDE_KEPT = 5  # the newest kept: enough to see what spoiled it; a loop of bad writes fills no disk


class CheckpointFile:
    """The checkpoint in directory, written in boot boot_id, rebuilt from specs when it cannot be read."""

    def __init__(self, directory: Path, boot_id: str, specs: ClaimSpecFiles) -> None:
        self.path = directory / CHECKPOINT_FILE
        self.boot_id = boot_id
        self._specs = specs
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime) of the checkpoint as last read
        self._written_boot = ""  # the boot the checkpoint on disk was written in

    @property
    def from_earlier_boot(self) -> bool:
        """Whether the checkpoint as last read or written was written in an earlier boot."""
        return self._written_boot != self.boot_id

    def load(self, known: Mapping[str, PreparedClaim]) -> dict[str, PreparedClaim] | None:
        """The claims, when the checkpoint changed since last read (None when it did not); one that cannot be read,
        or is missing while claim specs are there, is rebuilt from them (known: the claims as kept in memory).
        CheckpointTooNew and OutputError are raised."""
        seen = _identity(self.path)
        if seen is not None and seen == self._seen:
            return None
        try:
            checkpoint = read_checkpoint(self.path)
        except CheckpointTooNew:
            raise
        except CheckpointError as error:
            return self._rebuild(known, str(error))
        if checkpoint is None:
            if self._specs.any():
                return self._rebuild(known, f"{self.path} is missing, but claim CDI specs are there")
            self._seen, self._written_boot = None, self.boot_id
            return {}
        self._written_boot = checkpoint.boot_id
        self._seen = seen
        return dict(checkpoint.claims)

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Write the claims as the checkpoint, atomically; OutputError."""
        write_atomically(self.path, checkpoint_text(claims, self.boot_id))
        self._seen = _identity(self.path)
        self._written_boot = self.boot_id

    def _rebuild(self, known: Mapping[str, PreparedClaim], why: str) -> dict[str, PreparedClaim]:
        """The claims from their CDI specs (as kept in memory where known), written as the checkpoint; the old
        one is kept aside only once the rebuild is done, and replaced only by the rebuilt one. One that cannot be
        written (a full disk) leaves the old one as it was, the rebuilt claims served from memory: the next read
        rebuilds and writes again, and a change to the claims cannot be saved before that."""
        rebuilt = {uid: known.get(uid, claim) for uid, claim in self._specs.claims().items()}
        aside = None
        try:
            aside = keep_aside(self.path, ASIDE_LABEL) if self.path.exists() else None
            self.save(rebuilt)
        except OutputError as error:
            if not _no_room(error):
                raise  # a directory in its place, say: it will never be written, and the start says so
            if aside is not None:
                aside.unlink(missing_ok=True)  # the original stays where it was: one copy is enough
            self._seen, self._written_boot = None, self.boot_id  # the specs are this boot's
            log.error(
                "%s; %d claims rebuilt from their CDI specs in %s, not written: %s; trying again at the next "
                "prepare or unprepare",
                why,
                len(rebuilt),
                self._specs.cdi_dir,
                error,
            )
            return rebuilt
        kept = f"; kept as {aside}" if aside is not None else ""
        log.error("%s%s; %d claims rebuilt from their CDI specs in %s", why, kept, len(rebuilt), self._specs.cdi_dir)
        for removed in remove_oldest_aside(self.path, ASIDE_LABEL, ASIDE_KEPT):
            log.info("removed %s, older than the %d unreadable checkpoints kept", removed, ASIDE_KEPT)
        return rebuilt


def _no_room(error: OutputError) -> bool:
    """Whether the write failed for want of room (a full disk, a quota), which passes, unlike a path that cannot be
    written at all."""
    cause = error.__cause__
    return isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
