"""Small modules and short constructors: no module of the agent over 450 lines, no class's __init__ over 40.

The generated protobuf modules (api/) are left out: they are written by the compiler, not by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import ix_device_plugin

MAX_MODULE_LINES = 450
MAX_INIT_LINES = 40
PACKAGE = Path(ix_device_plugin.__file__).parent


def modules() -> list[Path]:
    """The hand-written modules of the agent."""
    return sorted(path for path in PACKAGE.rglob("*.py") if "api" not in path.relative_to(PACKAGE).parts[:1])


def test_the_agents_modules_are_found() -> None:
    names = {path.relative_to(PACKAGE).as_posix() for path in modules()}
    assert {"dra/driver.py", "hardware/monitor.py"} <= names
    assert not any(name.startswith("api/") for name in names)


def test_no_module_is_over_450_lines() -> None:
    lengths = {path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines()) for path in modules()}
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}


def test_no_class_constructor_is_over_40_lines() -> None:
    long: dict[str, int] = {}
    for path in modules():
        for cls in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(cls, ast.ClassDef):
                continue
            for init in cls.body:
                if isinstance(init, ast.FunctionDef | ast.AsyncFunctionDef) and init.name == "__init__":
                    assert init.end_lineno is not None
                    lines = init.end_lineno - min([init.lineno, *(d.lineno for d in init.decorator_list)]) + 1
                    if lines > MAX_INIT_LINES:
                        long[f"{path.relative_to(PACKAGE).as_posix()}:{cls.name}.__init__"] = lines
    assert long == {}
