"""The chaos soak's modules (e2e/soak/) loaded one by one for unit tests, without the e2e harness."""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

SOAK = Path(__file__).resolve().parents[2] / "e2e" / "soak"


def load(name: str) -> ModuleType:
    """e2e/soak/<name>.py alone, as soak.<name> (nothing of the e2e harness is imported); loaded once."""
    if f"soak.{name}" in sys.modules:
        return sys.modules[f"soak.{name}"]
    if "soak" not in sys.modules:
        package = importlib.util.spec_from_file_location("soak", SOAK / "__init__.py", submodule_search_locations=[])
        assert package is not None and package.loader is not None
        sys.modules["soak"] = importlib.util.module_from_spec(package)
    spec = importlib.util.spec_from_file_location(f"soak.{name}", SOAK / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"soak.{name}"] = module
    spec.loader.exec_module(module)
    return module


def imported_modules(path: Path) -> set[str]:
    """The modules a file imports, relative ones with their leading dots."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


class SoakStandIn:
    """What the fault actions and the model of healing (e2e/soak/faults.py, healing.py, returns.py) are handed, at a
    time the test sets, composed as the soak composes them: the simulated hardware in `directory`, one agent process
    `pid`, a node whose admin calls are recorded, and a device plugin's view with one unit per board of two chips,
    each counted while both its chips are healthy."""

    def __init__(self, directory: Path, pid: int) -> None:
        if str(SOAK.parent) not in sys.path:
            sys.path.insert(0, str(SOAK.parent))  # hardware.py names the chips as the e2e harness does
        checker, limits = load("checker"), load("limits")
        self.at = 0.0
        self.timeline = load("timeline").Timeline(clock=lambda: self.at)
        self.hardware = load("hardware").Hardware(directory)
        self.agent = SimpleNamespace(pids=[pid])
        self.admin_calls: list[tuple[str, ...]] = []
        self.cluster = SimpleNamespace(node_name="node", admin=self.admin)
        self.view = BoardUnits()
        names = ("lying reset not trusted", "reset limit")
        self.invariants = {name: checker.Invariant(name) for name in names}
        self.windows = load("windows").Windows(self.timeline.broken)
        self.later = load("later").Later(self.timeline.now)
        counts = limits.ResetCounts(load("schedule").CHIPS)
        parts = (self.timeline, self.hardware, self.windows, counts, self.later)
        self.returns = load("returns").Returns(*parts, self.cluster, None, self.invariants)
        self.healing = load("healing").Healing(*parts, self.returns, self.view, self.invariants)
        self.faults = load("faults").FaultActions(
            self.timeline, self.hardware, self.agent, self.cluster, self.view, self.later, self.healing, self.returns
        )

    def admin(self, *args: str) -> None:
        self.admin_calls.append(args)

    def soak(self, plugins_dir: Path, mode: str) -> Any:
        """The runner's Soak in `mode`, composed as the soak composes it, on this hardware and a node of admin calls."""
        cluster = SimpleNamespace(server="https://127.0.0.1:6443", admin_tls=lambda: None, admin=self.admin,
                                  plugins_dir=plugins_dir, node_name="node")  # fmt: skip
        agent = SimpleNamespace(mode=mode, pids=self.agent.pids)
        return load("runner").Soak(cluster, "soak", mode, 1, [], agent, self.hardware)

    @property
    def notes(self) -> list[str]:
        return [text for _, text in self.timeline.events]


class BoardUnits:
    """The device plugin's view as the fault actions use it: one unit per board of two chips (0-1, 2-3)."""

    mode = "device-plugin"
    restarts_for_config = False

    def units_of(self, healthy: Callable[[int], bool]) -> int:
        return sum(1 for board in (0, 2) if healthy(board) and healthy(board + 1))

    def ceiling_without(self, out: frozenset[int]) -> int:
        return self.units_of(lambda chip: chip not in out)
