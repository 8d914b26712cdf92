"""Each module says its one role: a docstring whose first line is one sentence, standing alone as its summary.

A module that needs two sentences to say what it is does two things, and is split. The generated protobuf modules
(api/*_pb2*) are left out: the compiler writes them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import ix_device_plugin

PACKAGE = Path(ix_device_plugin.__file__).parent
# A sentence ends at . ! or ? followed by a space and more words; "e.g." and "i.e." end none.
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)[.!?][`'\")\]]*\s+\S")


def modules() -> list[Path]:
    """Every hand-written module of the agent."""
    return sorted(path for path in PACKAGE.rglob("*.py") if "_pb2" not in path.name)


def role_problem(source: str) -> str | None:
    """What is wrong with the module docstring of source as a statement of its one role; None when nothing is."""
    docstring = ast.get_docstring(ast.parse(source), clean=True)
    if not docstring:
        return "no module docstring"
    lines = docstring.splitlines()
    first = lines[0].strip()
    if len(lines) > 1 and lines[1].strip():
        return f"the first line does not stand alone (the sentence goes on, or no blank line follows): {first!r}"
    if not first.endswith("."):
        return f"the first line is not a sentence ending in a full stop: {first!r}"
    if _SENTENCE_END.search(first):
        return f"the first line is more than one sentence: {first!r}"
    return None


def test_the_walk_finds_the_modules_and_leaves_out_the_generated_ones() -> None:
    names = {path.relative_to(PACKAGE).as_posix() for path in modules()}
    assert {"dra/driver.py", "api/generate.py", "__init__.py", "core/products.py"} <= names
    assert not any("_pb2" in name for name in names)


def test_every_module_names_its_one_role_in_one_sentence_on_its_first_line() -> None:
    problems = {
        path.relative_to(PACKAGE).as_posix(): problem
        for path in modules()
        if (problem := role_problem(path.read_text())) is not None
    }
    assert problems == {}


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ('"""The one role."""', None),
        ('"""The one role, e.g. a chip.\n\nMore. And more."""', None),
        ("x = 1", "no module docstring"),
        ('"""The role: one thing,\nand the next."""', "does not stand alone"),
        ('"""The role.\nMore words."""', "does not stand alone"),
        ('"""The role"""', "not a sentence ending in a full stop"),
        ('"""The role. And another."""', "more than one sentence"),
        ('"""Can it? It can."""', "more than one sentence"),
        ('"""The role (`x`). And another."""', "more than one sentence"),
    ],
)
def test_the_rule_reads_a_docstring_as_it_says(source: str, problem: str | None) -> None:
    found = role_problem(source)
    assert (found is None) if problem is None else (found is not None and problem in found)
