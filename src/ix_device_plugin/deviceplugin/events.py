"""The events the reconcile loop hears (deviceplugin/daemon.py).

Each input only turns a happening into one of these events on the loop's one queue, and the loop, the one writer of
the served State, takes them one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ix_device_plugin.hardware.monitor import HardwareView


@dataclass(frozen=True)
class FilesChanged:
    """The watcher woke up: these paths changed (possibly none: a timer tick)."""

    paths: frozenset[Path]


@dataclass(frozen=True)
class ReloadRequested:
    """SIGHUP: re-read the config even if its bytes look the same."""


@dataclass(frozen=True)
class HardwareChanged:
    """The hardware monitor has a new view of the chips."""

    view: HardwareView


@dataclass(frozen=True)
class NodeLabelChanged:
    """The node's configuration label has this value now (None: not set)."""

    value: str | None


@dataclass(frozen=True)
class RoleChanged:
    """This pod took the node's role (or serves the kubelet from now on): write the node files, serve."""


Event = FilesChanged | ReloadRequested | HardwareChanged | NodeLabelChanged | RoleChanged
