"""The one retry policy: capped exponential delays with jitter, and retrying a call until it works."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

T = TypeVar("T")


def is_transient(error: Exception) -> bool:
    """True for an error that says trying again later may succeed (its `transient` attribute)."""
    return bool(getattr(error, "transient", False))


@dataclass
class Backoff:
    """Capped exponential delays with jitter: initial, initial*factor, ... up to cap, each scaled by 1 +- jitter."""

    initial: float = 0.5
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        """The delay before the next try; each call makes the following one longer, up to cap."""
        base = min(self.cap, self.initial * self.factor**self.attempt)
        self.attempt += 1
        return min(self.cap, base * self.rng.uniform(1 - self.jitter, 1 + self.jitter))

    def reset(self) -> None:
        """Start again from the initial delay (after a success)."""
        self.attempt = 0

    async def sleep(self) -> None:
        """Wait the next delay."""
        await asyncio.sleep(self.next_delay())

    async def retry(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        attempts: int | None = None,
        errors: OncePerError | None = None,
        retry_if: Callable[[Exception], bool] = is_transient,
        recovered: str = "working again after retries",
    ) -> T:
        """call() until it succeeds; errors that retry_if accepts (transient ones) are retried, at most attempts
        tries (None: forever).

        Each distinct failure is logged once (through errors, or at WARNING here), and `recovered` once when a
        try works after a failure; an error that retry_if rejects, or the last one when the attempts are spent,
        is raised.
        """
        errors = errors or OncePerError(log, logging.WARNING)
        tries = 0
        while True:
            tries += 1
            try:
                result = await call()
            except Exception as error:
                if not retry_if(error) or (attempts is not None and tries >= attempts):
                    raise
                errors.failed("%s (retrying)", error)
                await self.sleep()
                continue
            errors.succeeded(recovered)
            self.reset()
            return result
