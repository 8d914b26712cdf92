"""How Allocate names devices to the runtime (`flags.deviceListStrategy`): the strategies and their parser."""

from __future__ import annotations

from typing import Any

DEVICE_SPECS = "device-specs"
CDI_CRI = "cdi-cri"
CDI_ANNOTATIONS = "cdi-annotations"
DEVICE_LIST_STRATEGIES = (DEVICE_SPECS, CDI_CRI, CDI_ANNOTATIONS)
DEFAULT_DEVICE_LIST_STRATEGY = (DEVICE_SPECS,)


def parse_device_list_strategy(value: object) -> tuple[str, ...]:
    """The device list strategies named by `flags.deviceListStrategy`: one name, or a list of names.

    Order is kept and repeats are dropped. Raises ValueError naming the bad value and the allowed ones.
    """
    allowed = ", ".join(DEVICE_LIST_STRATEGIES)
    items: list[object]
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ValueError(f"must be a string or a list of strings out of {allowed}; got {type(value).__name__}")
    if not items:
        raise ValueError(f"must name at least one of {allowed}")
    chosen: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{item!r} is not a string; allowed: {allowed}")
        name = item.strip()
        if name not in DEVICE_LIST_STRATEGIES:
            raise ValueError(f"unknown device list strategy {item!r}; allowed: {allowed}")
        if name not in chosen:
            chosen.append(name)
    return tuple(chosen)


def strategy_setting(value: Any, from_text: bool) -> tuple[str, ...]:
    """The setting's parser: as a flag or variable the list is comma-joined."""
    if from_text and isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    return parse_device_list_strategy(value)
