"""What the reconcile loop says of each change it serves.

The plan at start, each chip whose health changed, and what a configuration reload changed.
"""

from __future__ import annotations

import logging

from ix_device_plugin.core.plan import Plan
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.table import FILE_SETTINGS

log = logging.getLogger("ix_device_plugin.deviceplugin.daemon")  # where operators and tests have always read them


def log_plan(plan: Plan) -> None:
    log.info("advertising %d %s (%d healthy)", plan.capacity(), plan.resource_name, plan.healthy_count())
    for device in plan.devices:
        if not device.healthy and device.replica in (None, 0):
            log.warning("GPU %s is Unhealthy: %s", device.gpu, "; ".join(device.reasons))


def log_transitions(before: Plan, after: Plan) -> None:
    """One line per physical GPU whose health changed, with the chip and reason."""
    old = {d.gpu: d for d in before.devices}
    for device in after.devices:
        if device.replica not in (None, 0):
            continue
        previous = old.get(device.gpu)
        if previous is None or previous.healthy == device.healthy:
            continue
        if device.healthy:
            log.info("GPU %s is Healthy again", device.gpu)
        else:
            log.warning("GPU %s became Unhealthy: %s", device.gpu, "; ".join(device.reasons))


def config_diff(before: Config, after: Config) -> str:
    changes = [
        f"{s.key} {getattr(before, s.name)!r} -> {getattr(after, s.name)!r}"
        for s in FILE_SETTINGS
        if getattr(before, s.name) != getattr(after, s.name)
    ]
    return ", ".join(changes) or "no effective change"
