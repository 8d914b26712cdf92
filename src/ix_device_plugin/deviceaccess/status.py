"""The NRI injector sidecar's status file, read under bounds: it is another process's writing."""

from __future__ import annotations

import os
from pathlib import Path

from ix_device_plugin.core.deviceaccess import InjectorStatus, parse_injector_status

MAX_BYTES = 4096  # the injector writes one line; more is not its file


def read_injector_status(path: Path) -> tuple[InjectorStatus | None, str]:
    """What the injector said in path, or None and why it cannot be read (absent, unreadable, not its format)."""
    try:
        with open(path, "rb", opener=_no_follow) as file:
            raw = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None, f"{path}: absent"
    except OSError as error:
        return None, f"{path}: {error.strerror or error}"
    if len(raw) > MAX_BYTES:
        return None, f"{path}: over {MAX_BYTES} bytes, not the injector's status"
    try:
        return parse_injector_status(raw.decode("utf-8")), ""
    except UnicodeDecodeError:
        return None, f"{path}: not UTF-8 text"
    except ValueError as error:
        return None, f"{path}: {error}"


def _no_follow(path: str | os.PathLike[str], flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
