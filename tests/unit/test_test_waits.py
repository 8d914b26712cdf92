"""The suite waits on events, never by sleeping and then asserting: a fixed sleep is either too short on a busy
machine (a flake) or longer than needed everywhere else. These checks walk every test module's syntax tree."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

from helpers.support import TESTS_DIR

WAITS = TESTS_DIR / "helpers" / "waits.py"
# "path:line" of a sleep followed by an assert that is justified, with the reason. None today: a sleep that paces a
# load generator or lets the wall clock tick is not followed by an assert on state; anything else waits with until
# (the event happens) or stays (nothing happens for a stated period), from tests/helpers/waits.py.
ALLOWED_SLEEP_THEN_ASSERT: dict[str, str] = {}
WAIT_COPY_NAMES = {"until", "_until", "eventually", "_eventually", "wait_until", "poll_until", "stays", "always"}


def is_sleep(statement: ast.stmt) -> bool:
    """A statement that is only a call of some sleep: time.sleep(x), await asyncio.sleep(x), sleep(x)."""
    if not isinstance(statement, ast.Expr):
        return False
    call = statement.value.value if isinstance(statement.value, ast.Await) else statement.value
    if not isinstance(call, ast.Call):
        return False
    function = call.func
    return (isinstance(function, ast.Attribute) and function.attr == "sleep") or (
        isinstance(function, ast.Name) and function.id == "sleep"
    )


def blocks(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                yield block


def sleeps_then_asserts(source: str) -> list[int]:
    """Lines of each sleep statement followed directly, in the same block, by an assert."""
    tree = ast.parse(source)
    return sorted(
        first.lineno
        for block in blocks(tree)
        for first, second in pairwise(block)
        if is_sleep(first) and isinstance(second, ast.Assert)
    )


def suite_modules() -> list[Path]:
    return [path for path in sorted(TESTS_DIR.rglob("*.py")) if ".venv" not in path.parts]


def test_the_detector_finds_a_sleep_then_assert_in_either_form_and_nothing_else() -> None:
    source = (
        "import asyncio, time\n"
        "async def a():\n"
        "    await asyncio.sleep(0.5)  # settle\n"
        "    # a comment between does not hide it\n"
        "    assert x\n"
        "def b():\n"
        "    for _ in range(3):\n"
        "        time.sleep(1)\n"
        "        assert y, 'message'\n"
        "def c():\n"
        "    time.sleep(1)\n"
        "    x = 1\n"
        "    assert x\n"
        "async def d():\n"
        "    await until(lambda: x)\n"
        "    assert x\n"
    )
    assert sleeps_then_asserts(source) == [3, 8]


def test_no_test_sleeps_and_then_asserts() -> None:
    found = {
        f"{path.relative_to(TESTS_DIR)}:{line}"
        for path in suite_modules()
        for line in sleeps_then_asserts(path.read_text())
    }
    unjustified = sorted(found - ALLOWED_SLEEP_THEN_ASSERT.keys())
    assert unjustified == [], f"wait on the event with until, or use stays for a stated period: {unjustified}"
    stale = sorted(ALLOWED_SLEEP_THEN_ASSERT.keys() - found)
    assert stale == [], f"allowed but no longer there: {stale}"


def test_the_tests_have_one_until_and_one_stays() -> None:
    copies = [
        f"{path.relative_to(TESTS_DIR)}:{node.lineno} {node.name}"
        for path in suite_modules()
        if path != WAITS
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in WAIT_COPY_NAMES
    ]
    assert copies == [], f"wait through tests/helpers/waits.py, not a copy of it: {copies}"
