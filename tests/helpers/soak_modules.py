"""The chaos soak's modules (e2e/soak/) loaded one by one for unit tests, without the e2e harness."""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace

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
    """What the fault actions (e2e/soak/faults.py) see of a soak (e2e/soak/run.py's SoakRun), at a time the test
    sets: the simulated hardware in `directory`, one agent process `pid`, the device plugin's mode with one unit per
    board of two chips, each counted while both its chips are healthy."""

    def __init__(self, directory: Path, pid: int) -> None:
        if str(SOAK.parent) not in sys.path:
            sys.path.insert(0, str(SOAK.parent))  # hardware.py names the chips as the e2e harness does
        checker = load("checker")
        self.hardware = load("hardware").Hardware(directory)
        self.agent = SimpleNamespace(pids=[pid])
        self.mode = "device-plugin"
        self.broken: list[object] = []
        self.rollouts: list[object] = []
        self.quiet: list[tuple[float, float]] = []
        self.invariants = {"lying reset not trusted": checker.Invariant("lying reset not trusted")}
        self.notes: list[str] = []
        self.cluster = SimpleNamespace(node_name="node")
        self.admin_calls: list[tuple[str, ...]] = []
        self.at = 0.0

    def admin(self, *args: str) -> None:
        self.admin_calls.append(args)

    def now(self) -> float:
        return self.at

    def note(self, text: str) -> None:
        self.notes.append(text)

    def units_of(self, healthy: Callable[[int], bool]) -> int:
        return sum(1 for board in (0, 2) if healthy(board) and healthy(board + 1))
