"""The end-to-end suite's skip report: every skipped scenario and its reason in a block at the end of the run,
and under CI (`CI=true`) each skip turns the run into a failure.

Every scenario of the suite can run on a CI machine that `e2e/cluster/packages.sh` prepared, so a skip there
means something the run needed was missing (a package, helm, the image build's tools) and the scenario proved
nothing: it must not pass as green. Outside CI a skip stays a skip, but it is not lost in the output.
"""

from __future__ import annotations

import os

import pytest

CI_VALUES = ("true", "1", "yes")


def in_ci() -> bool:
    """True when the environment says this run is CI (CI=true, as .ci/run and the usual CI services set)."""
    return os.environ.get("CI", "").strip().lower() in CI_VALUES


def skip_reason(report: pytest.TestReport) -> str:
    """The reason given to pytest.skip (or a skip mark) for a skipped report."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ")
    return str(longrepr)


class SkipReport:
    """A pytest plugin: collects the skipped scenarios, reports them last, fails the run in CI."""

    def __init__(self, ci: bool) -> None:
        self.ci = ci
        self.skipped: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.setdefault(report.nodeid, skip_reason(report))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.ci and self.skipped and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.skipped:
            return
        count = len(self.skipped)
        verdict = "a failure in CI (CI=true), where every scenario must run" if self.ci else "not run"
        terminalreporter.section(f"e2e: {count} scenario(s) skipped: {verdict}", sep="!", red=True, bold=True)
        for nodeid, reason in self.skipped.items():
            terminalreporter.line(f"SKIPPED {nodeid}: {reason}", red=True)
        if self.ci:
            terminalreporter.line("FAILED: the run is marked failed because of the skips above", red=True, bold=True)


def register(config: pytest.Config) -> None:
    """Add the skip report to this run (from the suite's conftest)."""
    config.pluginmanager.register(SkipReport(in_ci()), "ix-e2e-skip-report")
