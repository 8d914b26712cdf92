"""What the hardware monitor hands its subscribers (`HardwareView`), and how often it looks (`MonitorSettings`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ix_device_plugin.core.inventory import Inventory


@dataclass(frozen=True)
class HardwareView:
    """What the node has now; version grows with every change."""

    inventory: Inventory
    version: int = 0
    discovered: bool = False  # False until a discovery succeeded


Subscriber = Callable[[HardwareView], None]


@dataclass(frozen=True)
class MonitorSettings:
    """How often the monitor looks, and what it leaves alone."""

    health_interval: float = 5.0
    rediscover_interval: float = 60.0
    dev_root: Path = Path("/")
    watch_dev: bool = True  # follow /dev for hot-plug
    health_stale_after: float = 60.0  # liveness fails when the last good poll is older than this
