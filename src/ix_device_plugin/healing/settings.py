"""Self-healing's settings: what a front end says of how its healer works, in one object.

The front end builds it once; NodeHealing, the healer and its parts read it and never change it. What it holds is
configuration and the readers of it (the health policy, the switch, whether this pod acts for the node), not the
collaborators (the monitor, the reset, the guard, the record's file), which are handed over beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ix_device_plugin.core.healing import ResetLimit, Rules
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.health import HealthPolicy

FREE_POLL = 1.0  # seconds between looks at whether a waiting chip is free (and, on standby, at the node's role)


def _always() -> bool:
    return True


def _defaults() -> Config:
    return Config()


@dataclass(frozen=True)
class HealingSettings:
    """How one front end's self-healing works.

    policy and switch read the current configuration (the health policy, and health.selfHealing: auto, true,
    false); limit, the reset limit (health.resetLimit within health.resetWindow), read when a chip goes out of
    service and when the record is written. story: the story file `list` shows (None: none). rules: how hard a
    chip is tried (attempts, backoff).
    acting: whether this process acts for the node now (the pod holding the node's role; another pod on standby
    follows the chips but neither resets nor writes Events, the story or the record until it takes over).
    boot_id: the boot the record's times belong to; writer: who this process is, as the record names it.
    node_watched: the front end watches its Node already and hands on the operator's annotation.
    flush_interval: how often repeats of a Node Event are written (None: the Events' default).
    free_poll: seconds between looks at whether a waiting chip is free.
    config: the configuration in force (the reset diagnostic: health.resetDiagnostic and its timeout).
    """

    policy: Callable[[], HealthPolicy]
    switch: Callable[[], str]
    story: Path | None = None
    rules: Rules = field(default_factory=Rules)
    acting: Callable[[], bool] = _always
    boot_id: str = ""
    writer: str = ""
    node_watched: bool = False
    flush_interval: float | None = None
    free_poll: float = FREE_POLL
    config: Callable[[], Config] = _defaults

    def limit(self) -> ResetLimit:
        """The reset limit in force: health.resetLimit within health.resetWindow."""
        config = self.config()
        return ResetLimit(config.reset_limit, config.reset_window)
