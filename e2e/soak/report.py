"""The soak's report: the seed, the schedule, every fault and what the agent did, each invariant's counts, the
timeline around each violation, and (with matplotlib installed) a plot of what was in service over time."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from .schedule import kinds_used

if TYPE_CHECKING:
    from .runner import Soak

AROUND_S = 15.0
SUMMARIES: list[str] = []  # every soak's summary line, printed last in the run (e2e/tests/conftest.py)
REPORTS: list[str] = []  # where each soak's report is, printed just before
# The test's report properties (record_property) that carry those lines to the process that prints them.
SUMMARY_PROPERTY = "soak-summary"
REPORT_PROPERTY = "soak-report"


def summary(soak: Soak) -> str:
    """The line tools read: `soak <mode> seed <n>: <f> faults of <k> kinds, <c> checks, <v> violations`."""
    checks = sum(i.checks for i in soak.invariants.values())
    violations = sum(len(i.violations) for i in soak.invariants.values())
    faults = soak.timeline.faults_done
    return (
        f"soak {soak.mode} seed {soak.seed}: {len(faults)} faults of {len(kinds_used(faults))} kinds, "
        f"{checks} checks, {violations} violations"
    )


def write(soak: Soak, directory: Path, minutes: float) -> Path:
    path = directory / f"soak-{soak.mode}-seed{soak.seed}.md"
    timeline = soak.timeline
    lines = [
        f"# {summary(soak)}",
        "",
        f"{minutes:g} minutes planned, {timeline.now():.0f} s run, "
        f"{timeline.pods_created} pods created, agent started {soak.agent.starts} times "
        f"(the cluster's stalled DaemonSet controller restarted {soak.agent.controller_restarts} times), "
        f"{timeline.api_load[0]} API requests of the agent (at most {timeline.api_load[1]} in a minute).",
        soak.cost.line(),
        "",
    ]
    lines += ["## Invariants", "", "| invariant | checks | violations |", "|---|---|---|"]
    lines += [f"| {i.name} | {i.checks} | {len(i.violations)} |" for i in soak.invariants.values()]
    lines += ["", f"## Pods that failed ({len(timeline.failed)})", ""]
    lines += [f"- {pod}: {why}" for pod, why in sorted(timeline.failed.items())]
    lines += ["", "## Faults by kind", ""]
    counts: dict[str, int] = {}
    for step in timeline.faults_done:
        counts[step.kind] = counts.get(step.kind, 0) + 1
    lines += [f"- {kind}: {count}" for kind, count in sorted(counts.items())]
    for invariant in soak.invariants.values():
        for at, what in invariant.violations:
            lines += ["", f"## Violation of {invariant.name} at t+{at:.1f}s", "", what, "", "```"]
            lines += [f"t+{t:6.1f}s {text}" for t, text in timeline.events if abs(t - at) <= AROUND_S]
            lines += ["```"]
    lines += ["", "## Broken windows (the simulated hardware's faults, and when each was healed)", "", "```"]
    lines += [
        f"chip {b.chip} {b.since:6.1f} - {'open' if b.until is None else f'{b.until:.1f}'}: {b.why}"
        for b in timeline.broken
    ]
    lines += ["```", "", "## Schedule", "", "```", *[step.describe() for step in soak.steps], "```"]
    lines += ["", "## Timeline", "", "```", *[f"t+{t:6.1f}s {text}" for t, text in timeline.events], "```", ""]
    try:
        plot = plot_service(soak, directory)
    except Exception as error:  # a plot is a plus: a matplotlib that cannot draw it costs the report nothing
        lines.insert(3, f"No plot: {type(error).__name__}: {error}\n")
    else:
        lines.insert(3, f"Plot: {plot.name}\n" if plot is not None else "No plot: matplotlib is not installed\n")
    path.write_text("\n".join(lines))
    return path


def plot_service(soak: Soak, directory: Path) -> Path | None:
    """Units in service over time with faults marked; None without matplotlib."""
    service = soak.timeline.service
    if importlib.util.find_spec("matplotlib") is None or not service:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(11, 3.5))
    axes.step([t for t, _ in service], [u for _, u in service], where="post", label="in service")
    for step in soak.timeline.faults_done:
        axes.axvline(step.at, color="red", alpha=0.25)
        axes.annotate(step.kind, (step.at, 0), rotation=90, fontsize=6, va="bottom")
    axes.set_xlabel("seconds")
    axes.set_ylabel(soak.view.service_label)
    axes.set_title(summary(soak), fontsize=9)
    path = directory / f"soak-{soak.mode}-seed{soak.seed}.png"
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path
