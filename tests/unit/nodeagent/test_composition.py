"""The node agent is composed in one place: the node services are built by the kit (nodeagent/kit.py) and nowhere
else, and no front end wires them by setting an attribute on them once they are built."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[3] / "src" / "ix_device_plugin"
KIT = SOURCE / "nodeagent" / "kit.py"
FRONT_ENDS = (SOURCE / "deviceplugin" / "daemon.py", SOURCE / "dra" / "driver.py")
NODE_SERVICES = ("HardwareMonitor", "GpuReset", "NodeHealing", "NodeRole", "RecordFile", "TelemetrySampler")
WIRED_AFTER = ("ignored", "node_turn", "quiet_others")  # what the front ends once set on a built collaborator


def _modules() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(SOURCE.rglob("*.py"))}


def _called(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "")
    return names


@pytest.mark.parametrize("service", NODE_SERVICES)
def test_each_node_service_is_built_by_the_kit_only(service: str) -> None:
    builders = [path.relative_to(SOURCE) for path, tree in _modules().items() if service in _called(tree)]
    assert builders == [KIT.relative_to(SOURCE)]


def test_both_front_ends_build_the_kit() -> None:
    for path in FRONT_ENDS:
        assert "NodeAgent" in _called(ast.parse(path.read_text())), path


def test_no_module_sets_a_node_service_collaborator_after_construction() -> None:
    wired = []
    for path, tree in _modules().items():
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                on_another = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute)
                if on_another and target.attr in WIRED_AFTER:
                    wired.append(f"{path.relative_to(SOURCE)}:{node.lineno} .{target.attr}")
    assert wired == []


# A target may set an attribute of another object only where the line says why in a comment naming this rule.
WIRING_ALLOWED = "# wiring allowed:"


def test_no_module_sets_an_attribute_on_a_collaborator() -> None:
    """`self.<part>.<attr> = ...` nowhere in src/ (augmented and annotated assignments too): collaborators are handed
    in at construction, and changed through their own verbs (a line may be let through with a comment starting
    WIRING_ALLOWED and saying why)."""
    wired = []
    for path, tree in _modules().items():
        lines = path.read_text().splitlines()
        for node in ast.walk(tree):
            for target in _targets(node):
                on_part = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute)
                if on_part and _is_self(target.value.value) and WIRING_ALLOWED not in lines[node.lineno - 1]:
                    wired.append(f"{path.relative_to(SOURCE)}:{node.lineno} self.{target.value.attr}.{target.attr}")
    assert wired == []


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        found = [node.target]
    else:
        return []
    return [part for target in found for part in (target.elts if isinstance(target, ast.Tuple) else [target])]


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def test_the_front_ends_reach_into_no_part_of_the_kit() -> None:
    """A front end calls the kit's verbs: no `self.node.<part>.<member>`."""
    reached = [
        f"{path.name}: {found.group(0)}"
        for path in FRONT_ENDS
        for found in re.finditer(r"self\.node\.\w+\.\w+", path.read_text())
    ]
    assert reached == []
