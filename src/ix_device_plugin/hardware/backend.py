"""The seam between the plugin and the hardware."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ix_device_plugin.core.inventory import ChipStatus, Inventory
from ix_device_plugin.core.telemetry import ChipSample
from ix_device_plugin.settings.table import DEFAULT_IXSMI as DEFAULT_IXSMI


class BackendError(Exception):
    """The backend cannot answer at all (library missing, init failed, bad file)."""


@dataclass(frozen=True)
class XidEvent:
    """The library reported a critical XID error (its number) on the chip with this UUID."""

    uuid: str
    xid: int


# Called with each XID event, from a thread of the backend's own: it must only hand the event on.
XidSink = Callable[[XidEvent], None]


class Backend(Protocol):
    """Answers "what is there" and "how healthy is it"; knows nothing of Kubernetes."""

    name: str

    def discover(self) -> Inventory:
        """Every board and chip with its current status; raises BackendError when it cannot."""
        ...

    def health(self, inventory: Inventory) -> Mapping[str, ChipStatus]:
        """Current status of each chip of inventory, by UUID; chips it cannot reach are not present."""
        ...

    def sample(self, inventory: Inventory) -> Mapping[str, ChipSample]:
        """Telemetry of each chip of inventory, by UUID, in one pass; a figure the hardware lacks is None."""
        ...

    def reset(self, uuids: Sequence[str], timeout: float, abort: threading.Event | None = None) -> None:
        """Reset these chips (the library is released first; the next discover opens it again);
        raises BackendError saying why when the reset fails or takes longer than timeout seconds, or abort
        is set (from another thread: the plugin is stopping) before it ends."""
        ...

    def reset_problem(self) -> str | None:
        """Why no reset can work here as the agent is deployed (what is missing, and what provides it); None when
        one can. Asked before anything of a reset is done: a reset that cannot work is not tried."""
        ...

    def xids_watched(self) -> frozenset[str] | None:
        """The chips whose XID events are being waited for now (the event set registered, its waiter alive); None
        when this backend has no XID events at all (health comes from polling alone)."""
        ...

    def watch_xids(self, sink: XidSink) -> None:
        """From the next discover() on, hand every critical XID event to sink (from a thread of the
        backend's own, re-registered after each rediscovery); a backend without events only says so."""
        ...

    def close(self) -> None:
        """Release the library or files (stopping any event thread first)."""
        ...
