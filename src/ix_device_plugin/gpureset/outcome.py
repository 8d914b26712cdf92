"""What the users of the GPU reset service know of a reset without loading its machinery.

Its error, its outcomes as the metrics count them, and how long a stop waits for a running ixsmi.
"""

from __future__ import annotations

# A reset's outcome, as the gpu_resets metrics count it: cancelled is one cut short by a stop (its ixsmi killed, or
# the release it waited for called off), not a failure of the reset.
CANCELLED = "cancelled"
# unavailable: no reset can work here as the agent is deployed (no privilege, no reset helper): nothing was tried,
# no other IXML user was asked to let go.
UNAVAILABLE = "unavailable"
RESET_RESULTS = ("ok", "failed", "refused", "uuid_changed", CANCELLED, UNAVAILABLE)

RESET_STOP_WAIT = 10.0  # a stop waits this long for a running ixsmi before killing it
KILL_WAIT = 3.0  # ... and this long for it to be gone


class GpuResetError(Exception):
    """A reset did not happen or did not work; the message says why and is what Allocate answers."""

    def __init__(self, message: str, result: str = "failed") -> None:
        super().__init__(message)
        self.result = result  # for the metric: failed, refused, uuid_changed, unavailable
