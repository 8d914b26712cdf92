"""The DRA driver's config under soak: the same four ix-configs as the device plugin's (schedule.py's
DEVICE_PLUGIN_CONFIGS), which the driver reads as docs/dra.md ("Shares") says. Pure.

| config | the node's ResourceSlice |
|---|---|
| `flags.splitboard` alone, or `{}` | every chip (`gpu-<n>`) and board (`board-<lowest n>`), each held whole |
| `sharing.timeSlicing.replicas: 2` | the boards only, each shared: 2 shares (a claim of the board class takes one) |
| both | the chips only, each shared: 2 shares (a claim of the chip class takes one) |

The driver reads its config at start: a change takes effect when it restarts. The soak changes it as an operator
does: `helm upgrade` of `config.content` (the pod annotation changed too, so that each revision's pods are its
config's), then the driver's pod deleted; a `helm rollback` that brings another config back is followed by the same
restart (drawatch.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from .schedule import DEVICE_PLUGIN_CONFIGS

DRIVER = "gpu.iluvatar.com"  # the chip class; its board class is board.<DRIVER>


def first_config(seed: int, mode: str) -> int:
    """The config the agent starts with: device plugin, `{}` (as ever, so its seeds replay); DRA, one drawn from the
    seed, so that shares are on from the start in half the soaks."""
    if mode != "dra":
        return 1
    return random.Random(f"{seed}:dra:config").randrange(len(DEVICE_PLUGIN_CONFIGS))


def replicas(config: Mapping[str, Any]) -> int:
    """The shares of each device (0: held whole)."""
    value = (config.get("sharing") or {}).get("timeSlicing", {}).get("replicas", 0)
    return value if isinstance(value, int) and value >= 2 else 0


def splitboard(config: Mapping[str, Any]) -> bool:
    return bool((config.get("flags") or {}).get("splitboard"))


def boards_shared(config: Mapping[str, Any]) -> bool:
    """The slice offers whole boards only, each shared: its chips go in and out of service together."""
    return replicas(config) > 0 and not splitboard(config)


def share_class(config: Mapping[str, Any]) -> str:
    """The DeviceClass whose devices are shared under config: boards when it shares whole boards, else chips (held
    whole where nothing is shared: a share shape then asks what the node does not offer, or a chip)."""
    return f"board.{DRIVER}" if boards_shared(config) else DRIVER


def together(config: Mapping[str, Any], chips: int, board_of: Callable[[int], set[int]]) -> list[frozenset[int]]:
    """The chips the slice offers only as one device under config (checker.back_in_service's `together`)."""
    if not boards_shared(config):
        return []
    return sorted({frozenset(board_of(chip)) for chip in range(chips)}, key=min)
