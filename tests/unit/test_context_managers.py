"""A function decorated as a context manager yields: one that does not (a decorator left above the wrong function when
another was put in between) fails only when a `with` reaches it, which for the end-to-end harness is a run of the
real cluster. This walks the syntax tree of the package, the tests, the end-to-end suite and the bench."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.support import REPO_ROOT

ROOTS = ("src", "tests", "e2e", "bench")
DECORATORS = {"contextmanager", "asynccontextmanager"}


def decorated_as_context_manager(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in function.decorator_list:
        name = decorator.attr if isinstance(decorator, ast.Attribute) else getattr(decorator, "id", "")
        if name in DECORATORS:
            return True
    return False


def yields(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function's own body (not a function nested in it) yields."""
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Yield | ast.YieldFrom):
            return True
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            pending.extend(ast.iter_child_nodes(node))
    return False


def context_managers_that_do_not_yield(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and decorated_as_context_manager(node)
        and not yields(node)
    ]


def python_files() -> list[Path]:
    files = [path for root in ROOTS for path in (REPO_ROOT / root).rglob("*.py")]
    return [path for path in files if ".venv" not in path.parts and "_pb2" not in path.name]


def test_every_function_decorated_as_a_context_manager_yields() -> None:
    files = python_files()
    assert len(files) > 500
    found = [where for path in files for where in context_managers_that_do_not_yield(path)]
    assert found == []


def test_the_check_finds_a_decorator_above_the_wrong_function() -> None:
    tree = ast.parse(
        "import contextlib\n"
        "@contextlib.contextmanager\n"
        "def wait_for_policies():\n"
        "    def nested():\n"
        "        yield 1\n"
        "    return None\n"
        "def applied():\n"
        "    yield []\n"
    )
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [f.name for f in functions if decorated_as_context_manager(f) and not yields(f)] == ["wait_for_policies"]
