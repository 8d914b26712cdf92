"""The soak's judgement afterwards, once the workload is gone and the faults healed: every chip back, no reset under
a holder, nothing broken given, no admission refused, the reset limit, the agent's API load and nothing left."""

from __future__ import annotations

from collections.abc import Mapping

from harness.cluster import Cluster

from . import checker as c
from .agent import Agent
from .hardware import Hardware
from .healing import Healing
from .load import agent_requests
from .observe import leftovers, read_resets
from .timeline import Timeline
from .view import ModeView


class Judge:
    def __init__(
        self,
        cluster: Cluster,
        agent: Agent,
        hardware: Hardware,
        timeline: Timeline,
        view: ModeView,
        healing: Healing,
        invariants: Mapping[str, c.Invariant],
    ) -> None:
        self.cluster, self.agent, self.hardware, self.timeline = cluster, agent, hardware, timeline
        self.view, self.healing, self.invariants = view, healing, invariants

    def all_back(self, settle_s: float) -> None:
        """Every chip in service again (each chip one check), and no chip still broken `settle_s` after the end."""
        timeline, invariant = self.timeline, self.invariants["back in service"]
        self.view.all_back(invariant, timeline.now())
        for window in [w for w in timeline.broken if w.until is None]:
            what = f"chip {window.chip} ({window.why} at {window.since:.1f}) not healed within {settle_s:.0f} s"
            invariant.check(False, timeline.now(), what + " of the end, the workload gone")

    def afterwards(self) -> None:
        timeline, invariants, cluster = self.timeline, self.invariants, self.cluster
        for directory in (cluster.cdi_dir, cluster.plugins_dir, cluster.device_plugin_dir):
            files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if not p.is_dir())
            timeline.note(f"files in {directory}: {', '.join(files) or 'none'}")
        resets = read_resets(self.hardware.reset_log, self.hardware.chip_of, timeline.start)
        c.no_reset_under_holder(invariants["no reset under a holder"], resets, timeline.samples)
        self.healing.judge_limits(resets, timeline.now())
        self.view.judge_given(invariants["broken not given"])
        refused = invariants["no admission refused by the agent"]
        c.admission_failures(refused, timeline.failures, timeline.quiet, timeline.broken)
        self.view.judge(refused)
        self.api_load()
        self.nothing_left(agent_running=True)
        self.agent.stop()
        timeline.note("agent stopped")  # stop() returns once the process has exited: its files are gone by then
        self.nothing_left(agent_running=False)

    def nothing_left(self, agent_running: bool) -> None:
        cluster = self.cluster
        found = leftovers(cluster.device_plugin_dir, cluster.cdi_dir, cluster.plugins_dir, [], agent_running)
        c.nothing_left(self.invariants["nothing left"], self.timeline.now(), found)

    def api_load(self) -> None:
        """The agent's requests per minute, from the API server's audit log."""
        timeline = self.timeline
        requests = agent_requests(self.cluster.audit_log, timeline.start)
        per_minute = [
            sum(1 for r in requests if m * 60 <= r.at < (m + 1) * 60) for m in range(int(timeline.now() // 60) + 1)
        ]
        timeline.api_load = (len(requests), max(per_minute))
        timeline.note(f"the agent's API requests: {len(requests)}, per minute {per_minute}")
        c.requests_per_minute(self.invariants["API requests per minute"], requests, timeline.now())
