"""The suites wait on events, never by sleeping and then asserting, nor by sleeping, acting and then asserting: a fixed
sleep is either too short on a busy machine (a flake) or longer than needed everywhere else. These checks walk the
syntax tree of every module of the tests and of the end-to-end suite (its harness, scenarios and soak), and of the
bench, which waits with the tests' one until too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from helpers.support import REPO_ROOT, TESTS_DIR

E2E_DIR = REPO_ROOT / "e2e"
BENCH_DIR = REPO_ROOT / "bench"
# The one until and stays of the tests and the bench is ix_device_plugin.standins.waits (tests/helpers/waits.py names
# it); the end-to-end suite's look at a real API server (an error is "not yet") and show the components' logs when
# they fail, so it has its own.
WAITS = {E2E_DIR / "harness" / "waits.py"}
# "path:line" of a sleep followed by an assert that is justified, with the reason. None today: a sleep that paces a
# load generator, the soak's ticks or lets the wall clock tick is not followed by an assert on state; anything else
# waits with until (the event happens) or stays (nothing happens for a stated period), from tests/helpers/waits.py
# (ix_device_plugin.standins.waits) or, end to end, e2e/harness/waits.py.
ALLOWED_SLEEP_THEN_ASSERT: dict[str, str] = {}
WAIT_COPY_NAMES = {"until", "_until", "eventually", "_eventually", "wait_until", "poll_until", "stays", "always"}
# Calls that wait on an event (or for a stated period): a sleep followed by one of them before its assert is a pause,
# not a guess. wait* covers the stand-ins' wait_for, wait_registered, wait_slice, an Event's or a process's wait.
WAIT_CALLS = {"until", "stays", "until_sync", "stays_sync", "watching", "sleep"}


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


def waits(statement: ast.stmt) -> bool:
    """A statement that calls something waiting on an event: until, stays, a stand-in's watching, any wait*, a sleep."""
    for node in ast.walk(statement):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
            if name in WAIT_CALLS or name.startswith("wait"):
                return True
    return False


def asserted_after(block: list[ast.stmt]) -> bool:
    """Whether an assert comes in block before any statement that waits: the statements before it only act."""
    for statement in block:
        if isinstance(statement, ast.Assert):
            return True
        if waits(statement):
            return False
    return False


def sleeps_then_asserts(source: str) -> list[int]:
    """Lines of each sleep statement followed, in the same block, by an assert: directly, or after actions none of
    which waits on an event (sleep, act, assert guesses that the sleep was long enough for what the act needs)."""
    tree = ast.parse(source)
    return sorted(
        statement.lineno
        for block in blocks(tree)
        for index, statement in enumerate(block)
        if is_sleep(statement) and asserted_after(block[index + 1 :])
    )


def wait_loops(source: str) -> list[int]:
    """Lines of each while loop that sleeps between its looks: a wait written by hand."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.While) and any(isinstance(s, ast.stmt) and is_sleep(s) for s in ast.walk(node))
    )


def bench_modules() -> list[Path]:
    return sorted(BENCH_DIR.rglob("*.py"))


def suite_modules() -> list[Path]:
    """Every module of the tests and of the end-to-end suite, not what a run leaves in a hidden folder (venv, logs)."""
    return [
        path
        for directory in (TESTS_DIR, E2E_DIR)
        for path in sorted(directory.rglob("*.py"))
        if not any(part.startswith(".") for part in path.relative_to(REPO_ROOT).parts)
    ]


def test_the_checks_walk_both_suites() -> None:
    walked = {path.relative_to(REPO_ROOT).as_posix() for path in suite_modules()}
    assert {"tests/helpers/waits.py", "e2e/harness/waits.py", "e2e/tests/test_chart.py", "e2e/soak/runner.py"} <= walked


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
    assert sleeps_then_asserts(source) == [3, 8, 11]


def test_the_detector_finds_a_sleep_then_an_action_then_an_assert_unless_a_wait_comes_between() -> None:
    source = (
        "import asyncio\n"
        "async def acts_once():\n"
        "    await asyncio.sleep(0.3)  # the watch is open, it is hoped\n"
        "    server.put(changed)\n"
        "    assert seen\n"
        "async def acts_twice():\n"
        "    await asyncio.sleep(0.3)\n"
        "    task = start()\n"
        "    answer = await task\n"
        "    assert answer\n"
        "async def waits_between():\n"
        "    await asyncio.sleep(0.3)\n"
        "    server.put(changed)\n"
        "    await until(lambda: seen)\n"
        "    assert seen\n"
        "async def watches_between():\n"
        "    await asyncio.sleep(0.3)\n"
        "    await server.watching('pods')\n"
        "    server.put(changed)\n"
        "    assert seen\n"
        "async def paces():\n"
        "    for _ in range(3):\n"
        "        await asyncio.sleep(0.1)\n"
        "        server.put(changed)\n"
        "    assert seen\n"
    )
    assert sleeps_then_asserts(source) == [3, 7]


def test_no_test_sleeps_and_then_asserts() -> None:
    found = {
        f"{path.relative_to(REPO_ROOT)}:{line}"
        for path in suite_modules()
        for line in sleeps_then_asserts(path.read_text())
    }
    unjustified = sorted(found - ALLOWED_SLEEP_THEN_ASSERT.keys())
    assert unjustified == [], f"wait on the event with until, or use stays for a stated period: {unjustified}"
    stale = sorted(ALLOWED_SLEEP_THEN_ASSERT.keys() - found)
    assert stale == [], f"allowed but no longer there: {stale}"


def test_the_tests_have_one_until_and_one_stays() -> None:
    copies = [
        f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name}"
        for path in [*suite_modules(), *bench_modules()]
        if path not in WAITS
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in WAIT_COPY_NAMES
    ]
    assert copies == [], f"wait through tests/helpers/waits.py or e2e/harness/waits.py, not a copy: {copies}"


def test_the_detector_finds_a_loop_that_sleeps_between_looks() -> None:
    source = (
        "import asyncio\n"
        "async def by_hand():\n"
        "    while not ready():\n"
        "        await asyncio.sleep(0.05)\n"
        "async def paced():\n"
        "    for _ in range(3):\n"
        "        await asyncio.sleep(0.05)\n"
        "async def waits():\n"
        "    await until(ready, timeout=5)\n"
    )
    assert wait_loops(source) == [3]


def test_the_bench_waits_with_the_one_until() -> None:
    loops = [
        f"{path.relative_to(REPO_ROOT)}:{line}" for path in bench_modules() for line in wait_loops(path.read_text())
    ]
    assert loops == [], f"wait with ix_device_plugin.standins.waits (until), not a loop of its own: {loops}"
