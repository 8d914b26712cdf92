"""The requests the hardware monitor takes, one at a time, on its own task (besides the backend's XID events)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ix_device_plugin.hardware.backend import XidEvent
from ix_device_plugin.hardware.view import HardwareView


@dataclass(frozen=True)
class Rediscover:
    """Discover now; answer the view on done (None: a hint, nobody waits)."""

    done: asyncio.Future[HardwareView] | None = None


@dataclass(frozen=True)
class ClearXids:
    """A reset cleared these XIDs of the chip: read every chip's health again, forget them; answer the view on done."""

    uuid: str
    xids: frozenset[int]
    done: asyncio.Future[HardwareView]
    before: float | None = None  # monotonic: an XID reported again since is kept (None: forget them all)


@dataclass(frozen=True)
class Overlay:
    """Change what the agent lays over the chips' own health (holds, followed XIDs); answer the view on done."""

    change: Callable[[], None]
    done: asyncio.Future[HardwareView]


Request = XidEvent | Rediscover | ClearXids | Overlay
