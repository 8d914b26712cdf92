"""The device metadata files of the prepared claims, and the CDI specs that mount them.

Written, brought up to date and removed here only, by `DraState` under its lock (see metadata.py for what they hold
and where they are).

A file is written when its claim is prepared (generation 1), written again with the next generation when what it
says changes (a chip's health, a reset, another driver version), and left alone when it says the same: a driver
restart or a second prepare of the claim changes nothing. A file that is there is rewritten in place, since
running containers hold its inode. At unprepare the claim's files and specs go.

The next generation is one more than the last one given, which the checkpoint keeps (`changes` says which; the
state records them before `write` writes the files), or than the file says where that is more: a file found torn
after a stop in the middle of its write gets a number no reader saw, never one already used.

Files of the layout by name (`<namespace>_<name>`, before files were filed by claim UID) are carried over at start
by a hard link (`adopt_named`): the inode a running container has mounted stays the claim's file, and the next
generation reaches it. The directories by name go at start once the claims' specs mount the new paths.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ix_device_plugin.dra.metadata import (
    HOST_DIR,
    HOST_FILE,
    NodeFacts,
    cdi_spec,
    cdi_spec_file,
    cdi_spec_uid,
    claim_dir,
    generation_of,
    host_path,
    is_named_dir,
    named_claim_dir,
    request_files,
    requests_of,
    stream_text,
    uid_of,
    valid_label,
)
from ix_device_plugin.dra.prepared import PreparedClaim
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


@dataclass(frozen=True)
class Change:
    """A metadata file to write: the request it is of, the generation it is given, and its path and text."""

    request: str
    generation: int
    path: Path
    text: str


def with_generations(claim: PreparedClaim, changes: Sequence[Change]) -> PreparedClaim:
    """claim with the generations changes give its files, as the checkpoint keeps them."""
    if not changes:
        return claim
    given = {change.request: change.generation for change in changes}
    return replace(claim, metadata_generations={**claim.metadata_generations, **given})


class MetadataFiles:
    """The metadata files under root (the driver's directory) and their CDI specs in cdi_dir."""

    def __init__(self, root: Path, cdi_dir: Path) -> None:
        self.root = root
        self.cdi_dir = cdi_dir

    def changes(self, claim: PreparedClaim, facts: NodeFacts) -> list[Change]:
        """The claim's files whose text changes (or that are not there): each with its next generation. A claim
        rebuilt from its CDI spec (its name and requests unknown) has none yet; before the node's first discovery
        (facts not known) a file that is there is kept as it is."""
        if not claim.complete:
            return []
        changes = []
        for entry in request_files(claim, facts):
            path = host_path(self.root, claim.ref.uid, entry.request)
            before = current_text(path) if path.exists() else None
            if before is not None and not facts.known:
                continue
            on_file = generation_of(before) if before is not None else None
            if on_file is not None and before == stream_text(entry.document, on_file):
                continue
            generation = max(claim.metadata_generations.get(entry.request, 0), on_file or 0) + 1
            changes.append(Change(entry.request, generation, path, stream_text(entry.document, generation)))
        return changes

    def write(self, claim: PreparedClaim, changes: Sequence[Change]) -> int:
        """Write changes (the claim's, their generations recorded first), then its CDI specs; the files written.
        Raises OutputError."""
        for change in changes:
            _make_dirs(change.path.parent)
            overwrite_in_place(change.path, change.text)
        self.write_specs(claim)
        return len(changes)

    def write_specs(self, claim: PreparedClaim) -> None:
        """The CDI specs mounting the claim's files (the CDI directory may be a tmpfs a reboot emptied)."""
        if not claim.complete:
            return
        for request in requests_of(claim.devices):
            spec = json.dumps(cdi_spec(claim, request, self.root), indent=2) + "\n"
            write_if_changed(self.cdi_dir / cdi_spec_file(claim.ref.uid, request), spec)

    def remove(self, uid: str) -> None:
        """Remove the files and CDI specs of the claim uid (only its own: another claim of the same name has
        other ones); OutputError naming what stays."""
        directory = claim_dir(self.root, uid)
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise OutputError(f"cannot remove {directory}: {reason(error)}") from None
        for spec_uid, path in cdi_spec_files(self.cdi_dir):
            if spec_uid == uid:
                remove_file(path)

    def adopt_named(self, claims: Mapping[str, PreparedClaim]) -> None:
        """At start, before the claims' specs are written again: give each claim the file of the layout by name
        that is its own (the UID it names, or the one claim of that name), by a hard link, where it has none."""
        for directory in _directories(self.root / HOST_DIR):
            if not is_named_dir(directory.name):
                continue
            for request_dir in _directories(directory):
                source = request_dir / HOST_FILE
                text = current_text(source)
                owner = _owner(self.root, directory.name, text, claims) if text is not None else None
                if owner is not None and valid_label(request_dir.name):
                    self._link(source, host_path(self.root, owner, request_dir.name))

    @staticmethod
    def _link(source: Path, target: Path) -> None:
        if target.exists() or target.is_symlink():
            return
        try:
            _make_dirs(target.parent)
            os.link(source, target, follow_symlinks=False)
        except (OSError, OutputError) as error:
            why = reason(error) if isinstance(error, OSError) else str(error)
            log.warning("cannot carry %s over to %s (%s): it is written anew", source, target, why)
            return
        log.info("carried %s over to %s (one file: the containers mounting it see what comes next)", source, target)

    def remove_orphans(self, claims: Mapping[str, PreparedClaim]) -> None:
        """At start, once the claims' specs are written again: remove the specs and files of claims the checkpoint
        does not hold (an unprepare cut short), and the directories of the layout by name. While a claim's name is
        not known (rebuilt from its CDI spec, whose mount may still name one) those directories are kept."""
        remove_stale_temporaries(self.cdi_dir, cdi_spec_file("*", "*"))
        for uid, path in cdi_spec_files(self.cdi_dir):
            if uid not in claims:
                self._remove_orphan(path)
        every_name_known = all(claim.complete for claim in claims.values())
        for directory in _directories(self.root / HOST_DIR):
            named = is_named_dir(directory.name)
            if (named and every_name_known) or (not named and directory.name not in claims):
                self._remove_orphan(directory)

    @staticmethod
    def _remove_orphan(path: Path) -> None:
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            log.info("removed %s: no prepared claim has it", path)


def _owner(root: Path, directory: str, text: str, claims: Mapping[str, PreparedClaim]) -> str | None:
    """The claim whose file of the layout by name (in directory, holding text) it is: the UID the file names,
    when a claim of that name or one rebuilt without its name has it; else the one claim of that name."""
    named = [
        uid for uid, claim in claims.items() if claim.complete and named_claim_dir(root, claim.ref).name == directory
    ]
    said = uid_of(text)
    if said is not None and said in claims and (said in named or not claims[said].complete):
        return said
    return named[0] if len(named) == 1 else None


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
