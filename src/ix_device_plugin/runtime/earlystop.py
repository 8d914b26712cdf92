"""A SIGTERM that comes while the daemon starts, before its event loop listens for it.

In its pod the agent is the container's first process, the init of a PID namespace, and the kernel drops a signal
that such a process has no handler for: a pod deleted while the agent imports and reads its settings (a rollout
reversed at once, a pod deleted right after it was made) would run on, register with the kubelet after its stop
was asked for, and be killed when its grace period ends, its socket left behind. So the daemon modes take SIGTERM
first thing, and the service stops as soon as it listens (`Service.install_signal_handlers`).
"""

from __future__ import annotations

import signal
from types import FrameType

_caught: list[int] = []


def catch() -> None:
    """Keep a SIGTERM from now on, until the service's own handler replaces this one."""
    signal.signal(signal.SIGTERM, _keep)


def caught() -> bool:
    """True when a SIGTERM came before the service listened."""
    return bool(_caught)


def _keep(signum: int, frame: FrameType | None) -> None:
    _caught.append(signum)
