"""Files written for others to read, atomically so that no reader sees half a file.

Temporary file, fsync, rename; in place only where a reader holds the inode (a file bind-mounted into a container).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

from ix_device_plugin.settings.documents import DocumentError, read_file

FILE_MODE = 0o644
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
CURRENT_LIMIT = 4 * 1024 * 1024  # what we write is far smaller; anything larger is not ours and gets replaced


class OutputError(Exception):
    """A file could not be written or removed; the message names the path and the reason."""


def write_atomically(path: Path, text: str) -> None:
    """Replace path with text in one step, creating its directory when missing; raises OutputError."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create directory {directory}: {reason(exc)}") from exc
    # A dot-name ending in .tmp: NFD skips dot-files and CDI reads only *.yaml and *.json.
    try:
        handle, temp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {reason(exc)}") from exc
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fchmod(stream.fileno(), FILE_MODE)
            os.fsync(stream.fileno())
        os.replace(temp_name, path)
        _fsync_directory(directory)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise OutputError(f"cannot write {path}: {reason(exc)}") from exc


def overwrite_in_place(path: Path, text: str) -> None:
    """Write text into the regular file at path, keeping its inode: a file bind-mounted into a running container
    stays the inode it was when mounted, so a rename over it would never reach the container. Not atomic (a
    reader may see a part of it); a file that is not there yet is written atomically instead. Raises OutputError.
    """
    data = text.encode("utf-8")
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        write_atomically(path, text)
        return
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {reason(exc)}") from exc
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OutputError(f"cannot write {path}: not a regular file")
        written = 0
        while written < len(data):
            written += os.pwrite(descriptor, data[written:], written)
        os.ftruncate(descriptor, len(data))
        os.fsync(descriptor)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {reason(exc)}") from exc
    finally:
        os.close(descriptor)


def read_boot_id(path: Path = BOOT_ID) -> str:
    """This boot's ID ('' when the kernel does not say): tells a reboot from a restart."""
    try:
        return read_file(path, 128).decode("ascii", "replace").strip()
    except (OSError, DocumentError):
        return ""


def current_text(path: Path) -> str | None:
    """The file's text when it is a regular file we may have written; None for anything else (replaced).

    Read without following a symlink or blocking: a FIFO or a link to /dev/zero at the path never hangs us.
    """
    try:
        return read_file(path, CURRENT_LIMIT, follow_symlinks=False).decode("utf-8")
    except (OSError, UnicodeDecodeError, DocumentError):
        return None


def write_if_changed(path: Path, text: str) -> bool:
    """Write text atomically unless the file holds it already; True when the file changed. Raises OutputError."""
    if current_text(path) == text:
        return False
    write_atomically(path, text)
    return True


def remove_file(path: Path) -> bool:
    """Remove path; True when there was one. Raises OutputError naming the path."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise OutputError(f"cannot remove {path}: {reason(exc)}") from exc
    return True


def keep_aside(path: Path, label: str) -> Path:
    """A copy of path beside it, `<name>.<label>-<Unix time>` (`-<n>` added after the first of a second), the original
    left in place (a hard link where the file system allows); OutputError naming the file. A copy is never named
    before one already there (kept_aside orders them by name)."""
    stamp = int(time.time())
    taken = [number for (second, number), _ in _copies(path, label) if second == stamp]
    first = max(taken) + 1 if taken else 0
    for attempt in range(first, first + 100):
        aside = path.with_name(f"{path.name}.{label}-{stamp}" + (f"-{attempt}" if attempt else ""))
        try:
            os.link(path, aside, follow_symlinks=False)
            return aside
        except FileExistsError:
            continue
        except OSError:
            try:
                shutil.copyfile(path, aside, follow_symlinks=False)
                return aside
            except OSError as error:
                raise OutputError(f"cannot keep {path} aside as {aside}: {reason(error)}") from None
    raise OutputError(f"cannot keep {path} aside: too many copies beside it")


def kept_aside(path: Path, label: str) -> list[Path]:
    """The copies keep_aside made of path under label, oldest first."""
    return [entry for _, entry in sorted(_copies(path, label))]


def _copies(path: Path, label: str) -> list[tuple[tuple[int, int], Path]]:
    pattern = re.compile(rf"{re.escape(path.name)}\.{re.escape(label)}-([0-9]+)(?:-([0-9]+))?")
    copies = []
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            if found := pattern.fullmatch(entry.name):
                copies.append(((int(found[1]), int(found[2] or 0)), entry))
    return copies


def remove_oldest_aside(path: Path, label: str, kept: int) -> list[Path]:
    """Remove the copies keep_aside made of path under label but the kept newest; the paths removed. A copy that
    cannot be removed stays, and so does anything else beside path."""
    copies = kept_aside(path, label)
    removed = []
    for entry in copies[: max(0, len(copies) - kept)]:
        with contextlib.suppress(OSError):
            entry.unlink()
            removed.append(entry)
    return removed


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def reason(exc: OSError) -> str:
    """The words of an OSError, without its number."""
    return exc.strerror or str(exc)


TEMPORARY_MAX_AGE = 60.0  # seconds; a younger temporary may belong to a write under way in another process


def remove_stale_temporaries(directory: Path, name: str, max_age: float = TEMPORARY_MAX_AGE) -> list[Path]:
    """Remove the temporaries write_atomically left behind for files called name (a glob) after a kill -9 mid-write.

    Only those older than max_age: a younger one may be a write under way in another process. The paths removed.
    """
    removed = []
    now = time.time()
    try:
        candidates = list(directory.glob(f".{name}.*.tmp"))
    except OSError:
        return removed
    for path in candidates:
        try:
            if path.is_file() and not path.is_symlink() and now - path.stat().st_mtime > max_age:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed
