"""The tests' one way to wait on an event: ix_device_plugin.standins.waits, which the bench waits with too."""

from ix_device_plugin.standins.waits import (
    DEFAULT_INTERVAL,
    DEFAULT_TIMEOUT,
    WaitFailed,
    stays,
    stays_sync,
    until,
    until_sync,
)

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_TIMEOUT", "WaitFailed", "stays", "stays_sync", "until", "until_sync"]
