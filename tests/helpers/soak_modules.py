"""The chaos soak's modules (e2e/soak/) loaded one by one for unit tests, without the e2e harness."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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
