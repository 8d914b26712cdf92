"""The README's second command on a machine with only what its first installed: a test that needs more (helm,
podman, root, ...) is skipped saying why; in CI, where .ci/run provides it, its absence fails the test.

Every such test goes through tests/helpers/host_tools.py, so the rule is checked once here on the real suite (the chart
test of the dashboard, which needs helm) and on the source: no test skips by itself.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.support import REPO_ROOT, TESTS_DIR

CHART_TEST = (
    "tests/component/test_dashboard.py::test_the_chart_ships_the_dashboard_for_grafanas_sidecar_only_when_asked"
)
HELPER = TESTS_DIR / "helpers" / "host_tools.py"
# What the chart test runs besides helm: e2e/cluster/build.sh --print-dir, which finds a built helm.
BASE_TOOLS = ("bash", "dirname", "sha256sum", "cut")


def without_helm(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """The chart test run alone on a host where no helm can be found: a PATH of the base tools only, no $HELM,
    no end-to-end build cache; CI as given (None: unset)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in BASE_TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    env = {k: v for k, v in os.environ.items() if k not in ("HELM", "CI") and not k.startswith("PYTEST_")}
    env.update(PATH=str(bin_dir), IX_E2E_CACHE=str(tmp_path / "no-cache"))
    if ci is not None:
        env["CI"] = ci
    command = [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", "-n", "0", CHART_TEST]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_test_needing_helm_is_skipped_with_the_reason_where_there_is_none(tmp_path: Path) -> None:
    result = without_helm(tmp_path, ci=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout, result.stdout
    assert "helm not found: set HELM, put helm on PATH, or run `make e2e-build`" in result.stdout


def test_in_ci_a_test_needing_helm_fails_saying_why(tmp_path: Path) -> None:
    result = without_helm(tmp_path, ci="true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout, result.stdout
    assert "helm not found" in result.stdout and "CI=true, where .ci/run provides this" in result.stdout


def skips_outside_the_helper(path: Path) -> list[str]:
    """Where a test file skips by itself: pytest.skip(...) or a pytest.mark.skipif, as 'path:line'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute) or node.attr not in ("skip", "skipif"):
            continue
        on_pytest = isinstance(node.value, ast.Name) and node.value.id == "pytest"
        on_mark = isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
        if on_pytest or on_mark:
            found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    return found


def test_every_skip_of_the_suite_goes_through_the_one_rule() -> None:
    paths = [path for path in sorted(TESTS_DIR.rglob("*.py")) if path != HELPER]
    found = [hit for path in paths for hit in skips_outside_the_helper(path)]
    assert found == [], f"skip through tests/helpers/host_tools.py (missing, require), not by hand: {found}"
