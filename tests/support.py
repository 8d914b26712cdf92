"""Constants and types shared by the tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ix_device_plugin.lifecycle import Daemon

RESOURCE = "iluvatar.com/gpu"
DaemonFactory = Callable[..., Awaitable[Daemon]]
