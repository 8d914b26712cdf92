"""Which feature a GPU reset is for, so that what is said about the reset names it.

`flags.reset_gpu` (before an Allocate), self-healing, or a DRA claim's `reset: true`. The caller says it around its
call (`resetting_for`); the reset's task, made in the caller's context, carries it to the handshake and the log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

RESET_GPU = "flags.reset_gpu"
SELF_HEALING = "self-healing (health.selfHealing: true)"
CLAIM_RESET = "a claim's reset: true"
_feature: ContextVar[str] = ContextVar("gpu_reset_feature", default="a GPU reset")


@contextlib.contextmanager
def resetting_for(feature: str) -> Iterator[None]:
    """Resets asked for inside are feature's."""
    token = _feature.set(feature)
    try:
        yield
    finally:
        _feature.reset(token)


def reset_feature() -> str:
    """The feature the reset under way here is for."""
    return _feature.get()
