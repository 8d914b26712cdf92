"""What the soak's faults do later: each fault's end, the operator's returns and a flapping chip's next XID, run
when their time on the soak's clock is due, or all at once when the soak winds down."""

from __future__ import annotations

from collections.abc import Callable

Action = Callable[[], None]


class Later:
    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.due: list[tuple[float, Action]] = []
        self.ending = False  # the soak winds down: what is due is done now, and nothing new is waited for

    def after(self, seconds: float, action: Action) -> None:
        self.due.append((self.now() + seconds, action))

    def describe(self) -> str:
        """The actions still waiting, by name and when each is due."""
        waiting = sorted(self.due, key=lambda u: u[0])
        return ", ".join(f"{getattr(action, '__qualname__', action)} at t+{at:.0f} s" for at, action in waiting)

    @property
    def pending(self) -> bool:
        return bool(self.due)

    def run_due(self, now: float) -> None:
        """Every action due by `now` (one may add another, due later)."""
        for due in [u for u in self.due if u[0] <= now]:
            self.due.remove(due)
            due[1]()

    def finish(self) -> None:
        """The end of the soak: every action now, in the order they were due; what they ask for later is dropped."""
        self.ending = True
        for _, action in sorted(self.due, key=lambda u: u[0]):
            action()
        self.due.clear()
