"""The device metadata files of the prepared claims, and the CDI specs that mount them: written, brought up to date
and removed here only, by `DraState` under its lock (see metadata.py for what they hold and where they are).

A file is written when its claim is prepared (generation 1), written again with the next generation when what it
says changes (a chip's health, a reset, another driver version), and left alone when it says the same: a driver
restart or a second prepare of the claim changes nothing. A file that is there is rewritten in place, since
running containers hold its inode. At unprepare the claim's files and specs go.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from ix_device_plugin.dra.metadata import (
    HOST_DIR,
    NodeFacts,
    cdi_spec,
    cdi_spec_file,
    cdi_spec_uid,
    claim_dir,
    generation_of,
    host_path,
    request_files,
    requests_of,
    stream_text,
)
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim
from ix_device_plugin.runtime.files import (
    OutputError,
    current_text,
    overwrite_in_place,
    reason,
    remove_file,
    remove_stale_temporaries,
    write_if_changed,
)

log = logging.getLogger(__name__)

DIR_MODE = 0o755


class MetadataFiles:
    """The metadata files under root (the driver's directory) and their CDI specs in cdi_dir."""

    def __init__(self, root: Path, cdi_dir: Path) -> None:
        self.root = root
        self.cdi_dir = cdi_dir

    def write(self, claim: PreparedClaim, facts: NodeFacts) -> int:
        """Write the claim's files where what they say changed, and their CDI specs; the files written.
        A claim rebuilt from its CDI spec (its name and requests unknown) has none yet. Raises OutputError."""
        if not claim.complete:
            return 0
        written = 0
        for entry in request_files(claim, facts):
            path = host_path(self.root, claim.ref, entry.request)
            before = current_text(path) if path.exists() else None
            if before is not None and not facts.known:
                continue
            generation = generation_of(before) if before is not None else None
            if before is not None and generation is not None and before == stream_text(entry.document, generation):
                continue
            _make_dirs(path.parent)
            overwrite_in_place(path, stream_text(entry.document, (generation or 0) + 1))
            written += 1
        self.write_specs(claim)
        return written

    def write_specs(self, claim: PreparedClaim) -> None:
        """The CDI specs mounting the claim's files (the CDI directory may be a tmpfs a reboot emptied)."""
        if not claim.complete:
            return
        for request in requests_of(claim.devices):
            spec = json.dumps(cdi_spec(claim, request, self.root), indent=2) + "\n"
            write_if_changed(self.cdi_dir / cdi_spec_file(claim.ref.uid, request), spec)

    def remove(self, ref: ClaimRef) -> None:
        """Remove the claim's files (when its name is known) and CDI specs; OutputError naming what stays."""
        if ref.namespace and ref.name:
            directory = claim_dir(self.root, ref)
            try:
                shutil.rmtree(directory)
            except FileNotFoundError:
                pass
            except OSError as error:
                raise OutputError(f"cannot remove {directory}: {reason(error)}") from None
        for uid, path in cdi_spec_files(self.cdi_dir):
            if uid == ref.uid:
                remove_file(path)

    def remove_orphans(self, claims: Mapping[str, PreparedClaim]) -> None:
        """At start: remove the specs and files of claims the checkpoint does not hold (an unprepare cut short).
        While a claim's name is not known (rebuilt from its CDI spec) no directory is taken for an orphan."""
        remove_stale_temporaries(self.cdi_dir, cdi_spec_file("*", "*"))
        for uid, path in cdi_spec_files(self.cdi_dir):
            if uid not in claims:
                self._remove_orphan(path)
        if not all(claim.complete for claim in claims.values()):
            return
        kept = {claim_dir(self.root, claim.ref).name for claim in claims.values()}
        for directory in _directories(self.root / HOST_DIR):
            if directory.name not in kept:
                self._remove_orphan(directory)

    @staticmethod
    def _remove_orphan(path: Path) -> None:
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            log.info("removed %s: no prepared claim has it", path)


def cdi_spec_files(directory: Path) -> list[tuple[str, Path]]:
    """(claim UID, path) of every metadata CDI spec in directory."""
    found = [(cdi_spec_uid(path.name), path) for path in sorted(directory.glob(cdi_spec_file("*", "*")))]
    return [(uid, path) for uid, path in found if uid is not None]


def _make_dirs(directory: Path) -> None:
    try:
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot create directory {directory}: {reason(error)}") from None


def _directories(parent: Path) -> Iterable[Path]:
    try:
        return [path for path in parent.iterdir() if path.is_dir() and not path.is_symlink()]
    except OSError:
        return []
