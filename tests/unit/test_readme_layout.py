"""The README's package table is the map of the source tree: every package and every module is in it, by name.

A row's first cell names its packages (`dra/`) or top-level modules (`cli.py`); its second cell names each module
of those packages in backticks (`driver`), and each module of a subpackage after the subpackage (`ixml/` ...
`devices`). The generated protobuf modules (api/*_pb2*) and the packages' `__init__` are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

import ix_device_plugin

PACKAGE = Path(ix_device_plugin.__file__).parent
README = Path(__file__).resolve().parents[2] / "README.md"
HEADER = "| Package | What it is |"
_NAME = re.compile(r"`([^`]+)`")

Row = tuple[list[str], str]  # the names of the first cell, the second cell


def package_table(readme: str) -> list[Row]:
    """The rows of the README's package table."""
    lines = readme.splitlines()
    start = lines.index(HEADER) + 2  # the header, then its separator
    rows: list[Row] = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        first, second = line.strip("|").split("|", 1)
        rows.append((_NAME.findall(first), second))
    return rows


def hand_written(folder: Path) -> list[str]:
    """The names of folder's own hand-written modules, without `__init__`."""
    return sorted(path.stem for path in folder.glob("*.py") if path.stem != "__init__" and "_pb2" not in path.name)


def missing_from(rows: list[Row], root: Path) -> list[str]:
    """What of the tree under root the table does not name, each as its path under root."""
    by_name = {name: second for names, second in rows for name in names}
    missing = [f"{module}.py" for module in hand_written(root) if f"{module}.py" not in by_name]
    for package in sorted(path for path in root.iterdir() if (path / "__init__.py").is_file()):
        if f"{package.name}/" not in by_name:
            missing.append(f"{package.name}/")
            continue
        missing += [f"{package.name}/{name}" for name in _unnamed(package, by_name[f"{package.name}/"], package)]
    return missing


def _unnamed(folder: Path, cell: str, package: Path) -> list[str]:
    """The modules under folder (package or one of its subpackages) that cell does not name, by path under package."""
    prefix = "" if folder == package else f"{folder.relative_to(package).as_posix()}/"
    unnamed = [f"{prefix}{name}" for name in hand_written(folder) if f"`{name}`" not in cell]
    for sub in sorted(path for path in folder.iterdir() if (path / "__init__.py").is_file()):
        if not hand_written(sub):
            continue  # generated modules only (api/dra_v1/)
        marker = f"`{sub.name}/`"
        if marker not in cell:
            unnamed.append(f"{prefix}{sub.name}/")
            continue
        unnamed += _unnamed(sub, cell[cell.index(marker) :], package)
    return unnamed


def test_the_readme_names_every_package_and_module_of_the_tree() -> None:
    assert missing_from(package_table(README.read_text()), PACKAGE) == []


def test_every_name_in_the_first_column_is_in_the_tree() -> None:
    names = [name for names, _ in package_table(README.read_text()) for name in names]
    assert [name for name in names if not (PACKAGE / name).exists()] == []


def test_a_module_left_out_of_the_table_is_found(tmp_path: Path) -> None:
    (tmp_path / "dra" / "sub").mkdir(parents=True)
    for path in ("cli.py", "extra.py", "dra/__init__.py", "dra/driver.py", "dra/watches.py"):
        (tmp_path / path).write_text("")
    for path in ("dra/sub/__init__.py", "dra/sub/inner.py", "dra/sub/api_pb2.py"):
        (tmp_path / path).write_text("")
    rows = package_table(f"{HEADER}\n|---|---|\n| `dra/`, `cli.py` | `driver` (composition), `sub/` |\n\nafter")
    assert missing_from(rows, tmp_path) == ["extra.py", "dra/watches", "dra/sub/inner"]
