"""The soak's operator: returns a chip left to one (`kubectl annotate node ... iluvatar.com/gpu.return=<uuid>`),
when an operator would, and checks that the reset limit said so in a Node Event first."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from datetime import datetime

from harness.cluster import Cluster
from harness.kube import KubectlError

from . import checker as c
from .hardware import Hardware
from .later import Later
from .limits import ResetCounts
from .observe import Api, read_resets
from .timeline import Timeline
from .windows import OFF_BUS, Windows

RETURN_ANNOTATION = "iluvatar.com/gpu.return"
RETURN_RETRY_S = 2.0  # a return the agent may not see now is made again this much later
SAY_AGAIN_S = 5.0  # after a quiet window: what a new agent process says again (an Event) has reached the server
CLEAR_WAIT_S = 5.0  # a chip left to an operator while hot is returned once it has cooled: asked again this often
LIMIT_REASON = "GPUResetLimitReached"


class Returns:
    def __init__(
        self,
        timeline: Timeline,
        hardware: Hardware,
        windows: Windows,
        counts: ResetCounts,
        later: Later,
        cluster: Cluster,
        api: Api,
        invariants: Mapping[str, c.Invariant],
    ) -> None:
        self.timeline, self.hardware, self.windows, self.counts, self.later = timeline, hardware, windows, counts, later
        self.cluster, self.api, self.limit = cluster, api, invariants["reset limit"]
        self.returned: dict[int, float] = {}  # chip -> when the operator last returned it
        self.deferred: set[int] = set()  # chips whose return waits for the agent to see the Node again

    def operator_returns(self, chip: int) -> None:
        """The operator's annotation, removed first: only a chip newly named there is a request (README, "The
        operator's way back"), and the last return may have named this one. Not while the agent may not see the Node
        change (a quiet window: it restarts, or the API server is away): the removal and the setting again of one
        value in that time is not seen (docs/deployment.md), so the operator asks once it is over."""
        timeline, admin, node = self.timeline, self.cluster.admin, self.cluster.node_name
        if timeline.quiet_at(timeline.now()):
            if chip not in self.deferred and not self.later.ending:  # at the end, return_open asks again
                self.deferred.add(chip)
                self.later.after(RETURN_RETRY_S, lambda: self.deferred_return(chip))
            return
        uuid = self.hardware.uuids[chip]
        self.returned[chip] = timeline.now()
        certain = self.windows.waits_for_return(chip, present=chip not in self.hardware.absent)
        self.counts.returned(chip, timeline.now(), certain)
        with contextlib.suppress(KubectlError, AssertionError):
            admin("annotate", "node", node, f"{RETURN_ANNOTATION}-")
        self.windows.close(
            lambda ch, since, by, why: ch == chip and by == "return" and why.startswith(OFF_BUS),
            timeline.now(),
            "returned by the operator",
        )
        # A return is no cure for an XID: the agent resets the chip once more and only a reset that succeeds brings
        # it back (README, "The operator's way back"); one that fails or hangs leaves it needing an operator again.
        # (A chip back on the bus is closed above: its absence was a health condition, not an XID.)
        self.windows.awaits_reset(chip, timeline.now())
        with contextlib.suppress(KubectlError, AssertionError):
            admin("annotate", "node", node, f"{RETURN_ANNOTATION}={uuid}", "--overwrite")
            timeline.note(f"operator returned chip {chip}")

    def deferred_return(self, chip: int) -> None:
        self.deferred.discard(chip)
        self.operator_returns(chip)

    def limit_return(self, chip: int) -> None:
        """The operator returns a chip left to one (after its cooling, if it is hot); one the limit left certainly must
        have been said in a GPUResetLimitReached Node Event."""
        mine = [by for ch, _, by, _ in self.windows.open if ch == chip]
        if not {"return", "either"} & set(mine):
            return
        if "clear" in mine and not self.later.ending:
            self.later.after(CLEAR_WAIT_S, lambda: self.limit_return(chip))
            return
        if self.timeline.quiet_at(self.timeline.now(), after=SAY_AGAIN_S) and not self.later.ending:
            # a new agent process says again what waits for an operator once it acts: its Event is judged then
            self.later.after(RETURN_RETRY_S, lambda: self.limit_return(chip))
            return
        since = self.counts.chips[chip].limited
        if since is not None:
            said = self.limit_said(self.hardware.uuids[chip], self.timeline.start + since - 2)
            what = f"chip {chip} left to an operator by the reset limit at {since:.1f}: no GPUResetLimitReached Event"
            self.limit.check(said, self.timeline.now(), what)
        self.operator_returns(chip)

    def return_open(self, untrusted: Callable[[int, float], bool]) -> None:
        """At the end: return (once more, one at a time) every chip still waiting for an operator, and every chip
        still broken whose reset failed, hung or may have lied (`untrusted`: chip, end -> whether its reset then was
        not certainly honest) since it broke, or since the operator last returned it: the agent counts a reset it
        could not prove as a failed attempt, and the last one leaves the chip to an operator (a failed reset an
        operator asked for needs an operator again, whatever window the agent's forgetting opened since); a chip the
        agent simply never reset is not returned: the end's check reports it."""
        resets = read_resets(self.hardware.reset_log, self.hardware.chip_of, self.timeline.start)
        failed = [
            (chip, r.started)
            for r in resets
            for chip in r.chips
            if not r.ok or r.ended is None or untrusted(chip, r.ended)
        ]

        def failed_since(chip: int, since: float) -> bool:
            since = min(since, self.returned.get(chip, since))
            return any(ch == chip and started >= since for ch, started in failed)

        def waits(chip: int, since: float, by: str, why: str) -> bool:
            return by in ("return", "either") or failed_since(chip, since)

        waiting = sorted({window[0] for window in self.windows.open if waits(*window)})
        if waiting and self.timeline.now() - max(self.returned.values(), default=0) > 10:
            self.operator_returns(waiting[0])

    def limit_said(self, uuid: str, since: float) -> bool:
        """Whether a GPUResetLimitReached Event on the Node names the chip, said at `since` (Unix time) or later."""
        try:
            events = self.api.items(f"/api/v1/events?fieldSelector=reason%3D{LIMIT_REASON}")
        except OSError:
            return False
        for event in events:
            said = event.get("lastTimestamp") or event.get("eventTime") or ""
            when = datetime.fromisoformat(said.replace("Z", "+00:00")).timestamp() if said else 0.0
            node = (event.get("involvedObject") or {}).get("kind") == "Node"
            if node and uuid in event.get("message", "") and when >= since:
                return True
        return False
