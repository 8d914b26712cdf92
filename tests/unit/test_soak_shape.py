"""The soak's own shape (e2e/soak/): parts composed once for the mode, none of them holding the soak; what depends on
the mode in one view per mode, not in branches; each module one role, named by its docstring's first line, and well
under the agent's ceiling of 450 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.soak_modules import SOAK, SoakStandIn, load

MAX_MODULE_LINES = 450
# Where a mode's name is a value rather than a branch of the soak: the schedule draws per mode and the first config
# is drawn per mode.
MODE_AS_VALUE = {"schedule.py", "draconfig.py"}


def modules() -> list[Path]:
    return sorted(path for path in SOAK.glob("*.py") if path.name != "__init__.py")


def test_each_module_says_its_role_first_and_stays_well_under_the_ceiling() -> None:
    for path in modules():
        tree = ast.parse(path.read_text())
        role = ast.get_docstring(tree)
        assert role, f"{path.name}: no docstring naming its role"
        assert len(path.read_text().splitlines()) < MAX_MODULE_LINES, path.name


def is_mode(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "mode") or (
        isinstance(node, ast.Attribute) and node.attr == "mode"
    )


def compares_the_mode(tree: ast.AST) -> list[int]:
    """Lines comparing something named `mode` (a variable or an attribute) with a mode's name."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(is_mode(n) for n in [node.left, *node.comparators])
        and any(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in [node.left, *node.comparators])
    ]


def test_no_part_branches_on_the_mode() -> None:
    branches = {
        f"{path.name}:{line}"
        for path in modules()
        if path.name not in MODE_AS_VALUE
        for line in compares_the_mode(ast.parse(path.read_text()))
    }
    assert branches == set(), "what depends on the mode belongs in its view (dpview.py, draview.py)"


@pytest.mark.parametrize("mode", ["device-plugin", "dra"])
def test_the_soak_composes_its_parts_for_the_mode_and_no_part_holds_the_soak(tmp_path: Path, mode: str) -> None:
    soak = SoakStandIn(tmp_path / "hardware", pid=100).soak(tmp_path / "plugins", mode)
    assert soak.view.mode == mode
    parts = [
        soak.timeline,
        soak.later,
        soak.view,
        soak.returns,
        soak.faults,
        soak.api_faults,
        soak.observer,
        soak.judge,
    ]
    holding = [type(part).__name__ for part in parts if any(value is soak for value in vars(part).values())]
    assert holding == []
    assert soak.faults.healing is soak.observer.healing is soak.judge.healing  # one model of healing


def test_every_fault_kind_the_schedule_draws_has_one_way_to_be_caused(tmp_path: Path) -> None:
    faults = SoakStandIn(tmp_path / "hardware", pid=100).faults
    schedule, api_kinds = load("schedule"), set(load("apifaults").KINDS)
    for mode in schedule.MODES:
        kinds = set(schedule.kinds_of(mode))
        assert kinds - api_kinds == set(faults.causes) & kinds and not api_kinds & set(faults.causes), mode
    assert set(faults.causes) <= set(schedule.kinds_of("device-plugin")) | set(schedule.kinds_of("dra"))
