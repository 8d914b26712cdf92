"""A SIGTERM that comes while the daemon starts, before its event loop listens for it.

In its pod the agent is the container's first process, the init of a PID namespace, and the kernel drops a signal
that such a process has no handler for: a pod deleted while the agent imports and reads its settings (a rollout
reversed at once, a pod deleted right after it was made) would run on, register with the kubelet after its stop
was asked for, and be killed when its grace period ends, its socket left behind. So the console script takes
SIGTERM first thing (entry.py), the daemon modes keep it, and the service stops as soon as it listens
(`Service.install_signal_handlers`); the other commands let go of it (`release`), a SIGTERM kept meanwhile ending
them as it would have.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

_caught: list[int] = []


def catch() -> None:
    """Keep a SIGTERM from now on, until the service's own handler replaces this one."""
    signal.signal(signal.SIGTERM, _keep)


def release() -> None:
    """SIGTERM as it was (it ends the process), and one kept meanwhile delivered now."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _caught:
        os.kill(os.getpid(), signal.SIGTERM)


def caught() -> bool:
    """True when a SIGTERM came before the service listened."""
    return bool(_caught)


def _keep(signum: int, frame: FrameType | None) -> None:
    _caught.append(signum)
