"""Render the Helm chart without helm, and check it against the static manifests.

helm is not always installable (it ships as a Go binary outside the package registries), so the
chart's templates keep to a subset of Go's text/template and Helm's functions that this module
renders the way `helm template` does: actions with trim markers, comments, `if`/`else if`/`else`,
`with`/`else`, `range`, `define`/`include`, parenthesised pipelines, and the functions in FUNCTIONS.
Anything outside the subset is an error rather than a silent difference.

    python scripts/render_chart.py render [--namespace NS] [--set-yaml YAML]   # print the objects
    python scripts/render_chart.py check                                       # chart == static files

`check` also runs the real `helm template` when a helm binary is on PATH.
"""

from __future__ import annotations

import argparse
import copy
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = ROOT / "deployments" / "helm" / "ix-device-plugin"
STATIC_DIR = ROOT / "deployments" / "static"
# The static files that `helm template` with default values must reproduce (the pod is an example).
STATIC_FILES = ("ix-config.yaml", "ix-device-plugin.yaml")
# The static files the chart must reproduce in DRA mode (dra.enabled, devicePlugin off), with their values.
DRA_STATIC_FILES = ("ix-config.yaml", "ix-dra-driver.yaml")
DRA_VALUES: dict[str, Any] = {"dra": {"enabled": True}, "devicePlugin": {"enabled": False}}
EXAMPLE_FILES = ("corex-example.yaml", "dra-examples.yaml")
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_RELEASE = "ix-device-plugin"


class TemplateError(Exception):
    """The template is malformed or uses something outside the supported subset."""


# ---------------------------------------------------------------- lexing

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|`[^`]*`)
      | (?P<number>-?\d+)
      | (?P<field>(?:\$[A-Za-z0-9_]*)?(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.|\$[A-Za-z0-9_]*)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<punct>[|()])
    )""",
    re.VERBOSE,
)


@dataclass
class Text:
    text: str


@dataclass
class Action:
    body: str


def _segments(source: str) -> list[Text | Action]:
    """Split a template into text and actions, applying the trim markers."""
    parts: list[Text | Action] = []
    pos = 0
    trim_next = False
    for match in _ACTION.finditer(source):
        text = source[pos : match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group(1):
            text = text.rstrip()
        parts.append(Text(text))
        body = match.group(2).strip()
        if not (body.startswith("/*") and body.endswith("*/")):
            parts.append(Action(body))
        trim_next = bool(match.group(3))
        pos = match.end()
    tail = source[pos:]
    parts.append(Text(tail.lstrip() if trim_next else tail))
    return parts


def _tokens(body: str) -> list[tuple[str, str]]:
    tokens = []
    pos = 0
    while pos < len(body):
        if body[pos:].strip() == "":
            break
        match = _TOKEN.match(body, pos)
        if not match or match.end() == pos:
            raise TemplateError(f"cannot parse {body!r} at {body[pos:]!r}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


# ---------------------------------------------------------------- parsing


@dataclass
class Node:
    """A parsed action or block; kind is text, output, if, with, range or define."""

    kind: str
    value: Any = None
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


_BLOCKS = ("if", "with", "range", "define")


def _parse(parts: list[Text | Action]) -> tuple[list[Node], dict[str, list[Node]]]:
    defines: dict[str, list[Node]] = {}
    stream = iter(parts)
    nodes, stop = _parse_block(stream, defines)
    if stop is not None:
        raise TemplateError(f"unexpected {{{{ {stop} }}}}")
    return nodes, defines


def _parse_block(stream: Iterator[Text | Action], defines: dict[str, list[Node]]) -> tuple[list[Node], str | None]:
    """Parse until an `end`/`else` closing the enclosing block; returns the nodes and the closer."""
    nodes: list[Node] = []
    for part in stream:
        if isinstance(part, Text):
            if part.text:
                nodes.append(Node("text", part.text))
            continue
        word, _, rest = part.body.partition(" ")
        if word in ("end", "else"):
            return nodes, part.body
        if word in _BLOCKS:
            nodes.extend(_parse_control(word, rest.strip(), stream, defines))
        elif word in ("template", "block") or ":=" in part.body or "=" in _tokens_text(part.body):
            raise TemplateError(f"unsupported action {{{{ {part.body} }}}}")
        else:
            nodes.append(Node("output", _tokens(part.body)))
    return nodes, None


def _tokens_text(body: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`', "", body)


def _parse_control(word: str, rest: str, stream: Iterator[Text | Action], defines: dict[str, list[Node]]) -> list[Node]:
    body, closer = _parse_block(stream, defines)
    if closer is None:
        raise TemplateError(f"{{{{ {word} {rest} }}}} has no end")
    node = Node(word, _tokens(rest), body)
    if closer.startswith("else"):
        if word == "define":
            raise TemplateError("define cannot have else")
        chained = closer[4:].strip()
        if chained.startswith("if ") or chained.startswith("with "):
            chained_word, _, chained_rest = chained.partition(" ")
            node.orelse = _parse_control(chained_word, chained_rest.strip(), stream, defines)
        else:
            node.orelse, closer = _parse_block(stream, defines)
            if closer != "end":
                raise TemplateError(f"{{{{ {word} {rest} }}}}: expected end after else")
    if word == "define":
        name = node.value[0][1] if node.value and node.value[0][0] == "string" else None
        if name is None:
            raise TemplateError(f"define needs a quoted name: {rest!r}")
        defines[_unquote(name)] = body
        return []
    return [node]


def _unquote(literal: str) -> str:
    if literal.startswith("`"):
        return literal[1:-1]
    return str(yaml.safe_load(literal))


# ---------------------------------------------------------------- evaluation


def truthy(value: object) -> bool:
    """Go template truth: false, 0, nil and empty strings, lists and maps are false."""
    if value is None or value is False:
        return False
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value != 0
    if isinstance(value, str | list | dict | tuple):
        return len(value) > 0
    return True


def to_yaml(value: object) -> str:
    """Helm's toYaml: keys sorted, block style, no trailing newline."""
    if value is None:
        return "null"
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True, width=1 << 20).rstrip("\n")


def _indent(width: int, text: str) -> str:
    pad = " " * width
    return pad + text.replace("\n", "\n" + pad)


def _printable(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise TemplateError(f"cannot print a {type(value).__name__} without toYaml: {value!r}")


def _quote(*values: object) -> str:
    return " ".join('"' + _printable(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)


def _required(message: str, value: object) -> object:
    if not truthy(value) and value is not False:
        raise TemplateError(message)
    return value


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "default": lambda fallback, *given: given[0] if given and truthy(given[0]) else fallback,
    "quote": _quote,
    "toYaml": to_yaml,
    "indent": lambda width, text: _indent(int(width), str(text)),
    "nindent": lambda width, text: "\n" + _indent(int(width), str(text)),
    "trunc": lambda length, text: str(text)[: int(length)],
    "trimSuffix": lambda suffix, text: str(text).removesuffix(suffix),
    "required": _required,
    "eq": lambda a, *others: any(a == other for other in others),
    "ne": lambda a, b: a != b,
    "not": lambda value: not truthy(value),
    "empty": lambda value: not truthy(value),
    "toString": _printable,
}


class Renderer:
    """Renders a parsed chart's templates against a Helm-style context."""

    def __init__(self, defines: dict[str, list[Node]]) -> None:
        self.defines = defines

    def render(self, nodes: list[Node], dot: object, root: object) -> str:
        return "".join(self._node(node, dot, root) for node in nodes)

    def _node(self, node: Node, dot: object, root: object) -> str:
        if node.kind == "text":
            return node.value
        if node.kind == "output":
            return _printable(self._pipeline(node.value, dot, root))
        value = self._pipeline(node.value, dot, root)
        if node.kind == "if":
            return self.render(node.body if truthy(value) else node.orelse, dot, root)
        if node.kind == "with":
            return self.render(node.body, value, root) if truthy(value) else self.render(node.orelse, dot, root)
        if node.kind == "range":
            # Go ranges over a map in key order.
            items = [value[key] for key in sorted(value)] if isinstance(value, dict) else list(value or [])
            if not items:
                return self.render(node.orelse, dot, root)
            return "".join(self.render(node.body, item, root) for item in items)
        raise TemplateError(f"unknown node {node.kind}")

    def _pipeline(self, tokens: list[tuple[str, str]], dot: object, root: object) -> object:
        commands = _split(tokens)
        if not commands or any(not command for command in commands):
            raise TemplateError(f"empty command in {' '.join(t for _, t in tokens)!r}")
        result: object = None
        for index, command in enumerate(commands):
            piped = (result,) if index else ()
            result = self._command(command, piped, dot, root)
        return result

    def _command(self, command: list[Any], piped: tuple[object, ...], dot: object, root: object) -> object:
        head = command[0]
        if isinstance(head, tuple) and head[0] == "ident":
            args = [self._operand(arg, dot, root) for arg in command[1:]]
            return self._call(head[1], [*args, *piped], dot, root)
        value = self._operand(head, dot, root)
        if callable(value):  # a method such as .Files.Get
            return value(*(self._operand(arg, dot, root) for arg in command[1:]), *piped)
        if len(command) > 1 or piped:
            raise TemplateError(f"{head!r} is not a function")
        return value

    def _call(self, name: str, args: list[object], dot: object, root: object) -> object:
        if name == "include":
            template, context = args
            if template not in self.defines:
                raise TemplateError(f"no template {template!r}")
            return self.render(self.defines[str(template)], context, root)
        if name in ("and", "or"):
            chosen = args[-1]
            for arg in args:
                if truthy(arg) != (name == "and"):
                    chosen = arg
                    break
            return chosen
        if name in ("true", "false", "nil"):
            return {"true": True, "false": False, "nil": None}[name]
        if name not in FUNCTIONS:
            raise TemplateError(f"function {name!r} is not in the supported subset")
        return FUNCTIONS[name](*args)

    def _operand(self, token: Any, dot: object, root: object) -> object:
        if isinstance(token, list):
            return self._pipeline_from_groups(token, dot, root)
        kind, text = token
        if kind == "string":
            return _unquote(text)
        if kind == "number":
            return int(text)
        if kind == "ident":
            return self._call(text, [], dot, root)
        return _field(text, dot, root)

    def _pipeline_from_groups(self, commands: list[list[Any]], dot: object, root: object) -> object:
        result: object = None
        for index, command in enumerate(commands):
            result = self._command(command, (result,) if index else (), dot, root)
        return result


def _split(tokens: list[tuple[str, str]]) -> list[list[Any]]:
    """Group tokens into commands separated by `|`; a parenthesised group becomes a nested list."""
    groups, rest = _split_until(list(tokens), 0)
    if rest != len(tokens):
        raise TemplateError("unbalanced parentheses")
    return groups


def _split_until(tokens: list[tuple[str, str]], pos: int) -> tuple[list[list[Any]], int]:
    commands: list[list[Any]] = [[]]
    while pos < len(tokens):
        kind, text = tokens[pos]
        if text == "(" and kind == "punct":
            inner, pos = _split_until(tokens, pos + 1)
            if pos >= len(tokens) or tokens[pos][1] != ")":
                raise TemplateError("missing )")
            commands[-1].append(inner)
        elif text == ")" and kind == "punct":
            return commands, pos
        elif text == "|" and kind == "punct":
            commands.append([])
        else:
            commands[-1].append((kind, text))
        pos += 1
    return commands, pos


def _field(path: str, dot: object, root: object) -> object:
    if path == ".":
        return dot
    head, *names = re.split(r"(?=\.)", path)
    if head.startswith("$"):
        if head != "$":
            raise TemplateError(f"variables other than $ are not supported: {head}")
        value: object = root
    else:
        value = dot
        names = [head, *names] if head else names
    for name in (n.lstrip(".") for n in names if n):
        if value is None:
            raise TemplateError(f"nil pointer evaluating {path}")
        if not isinstance(value, Mapping):
            raise TemplateError(f"can't evaluate field {name} in {path}: not a map")
        value = value.get(name)
    return value


def render_template(source: str, context: Mapping[str, Any], helpers: str = "") -> str:
    """Render one template text; helpers holds `define` blocks, as a chart's _helpers.tpl does."""
    _, defines = _parse(_segments(helpers))
    nodes, found = _parse(_segments(source))
    return Renderer({**defines, **found}).render(nodes, context, context)


# ---------------------------------------------------------------- charts


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Values merging as `helm -f`: maps merge key by key, anything else replaces; None deletes."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def chart_context(
    chart_dir: Path = CHART_DIR,
    overrides: Mapping[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    release: str = DEFAULT_RELEASE,
) -> dict[str, Any]:
    """The .Values, .Release and .Chart that templates see."""
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    values = deep_merge(yaml.safe_load((chart_dir / "values.yaml").read_text()) or {}, overrides or {})
    return {
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm", "IsInstall": True},
        "Chart": {key[0].upper() + key[1:]: value for key, value in meta.items()},
        "Files": {"Get": lambda name: (chart_dir / str(name)).read_text()},
    }


def render_chart(
    chart_dir: Path = CHART_DIR,
    overrides: Mapping[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    release: str = DEFAULT_RELEASE,
) -> str:
    """Render every template of the chart as `helm template` would print it (without its comments)."""
    context = chart_context(chart_dir, overrides, namespace, release)
    templates = sorted((chart_dir / "templates").glob("*"))
    defines: dict[str, list[Node]] = {}
    parsed = []
    for path in templates:
        if path.suffix not in (".yaml", ".yml", ".tpl"):
            continue
        nodes, found = _parse(_segments(path.read_text()))
        defines.update(found)
        if not path.name.startswith("_"):
            parsed.append((path, nodes))
    renderer = Renderer(defines)
    documents = []
    for path, nodes in parsed:
        try:
            text = renderer.render(nodes, context, context)
        except TemplateError as error:
            raise TemplateError(f"{path.name}: {error}") from error
        for document in re.split(r"^---\s*$", text, flags=re.MULTILINE):
            if yaml.safe_load(document) is not None:
                documents.append(f"# Source: {chart_dir.name}/templates/{path.name}\n{document.strip()}\n")
    return "---\n" + "---\n".join(documents)


def load_objects(text: str) -> list[dict[str, Any]]:
    """Parse a multi-document YAML stream, dropping empty documents."""
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Objects by (kind, namespace, name)."""
    result = {}
    for obj in objects:
        meta = obj.get("metadata", {})
        result[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
    return result


def static_objects(static_dir: Path = STATIC_DIR, names: tuple[str, ...] = STATIC_FILES) -> list[dict[str, Any]]:
    """The objects of the static files that the chart reproduces (with default values, or DRA_VALUES)."""
    return [obj for name in names for obj in load_objects((static_dir / name).read_text())]


def dra_objects(static_dir: Path = STATIC_DIR) -> list[dict[str, Any]]:
    """The objects of the DRA static file, which the chart renders with DRA_VALUES."""
    return static_objects(static_dir, DRA_STATIC_FILES)


def differences(rendered: list[dict[str, Any]], static: list[dict[str, Any]]) -> list[str]:
    """Human-readable differences between two sets of objects; empty when they are the same."""
    left, right = keyed(rendered), keyed(static)
    problems = [f"only in the chart: {key}" for key in left.keys() - right.keys()]
    problems += [f"only in the static files: {key}" for key in right.keys() - left.keys()]
    for key in sorted(left.keys() & right.keys()):
        problems += [f"{key}: {line}" for line in _diff(left[key], right[key], "")]
    return problems


def _diff(a: object, b: object, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        lines = []
        for key in sorted(a.keys() | b.keys(), key=str):
            lines += _diff(a.get(key, "<missing>"), b.get(key, "<missing>"), f"{path}.{key}")
        return lines
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b, strict=True)) for line in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path or '.'}: chart {a!r} != static {b!r}"]


def helm_render(chart_dir: Path = CHART_DIR, namespace: str = DEFAULT_NAMESPACE) -> str | None:
    """`helm template` output, or None when no helm binary is on PATH."""
    helm = shutil.which("helm")
    if helm is None:
        return None
    command = [helm, "template", DEFAULT_RELEASE, str(chart_dir), "--namespace", namespace]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def _check() -> int:
    static = static_objects()
    problems = differences(load_objects(render_chart()), static)
    dra = [f"dra: {line}" for line in differences(load_objects(render_chart(overrides=DRA_VALUES)), dra_objects())]
    problems += dra
    helm_text = helm_render()
    if helm_text is not None:
        problems += [f"helm: {line}" for line in differences(load_objects(helm_text), static)]
    for line in problems:
        print(line, file=sys.stderr)
    renderers = "helm and the built-in renderer" if helm_text is not None else "built-in renderer; no helm on PATH"
    if problems:
        print(f"chart and static manifests differ ({renderers})", file=sys.stderr)
        return 1
    print(f"chart renders the static manifests ({renderers})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render = commands.add_parser("render", help="print the chart's objects")
    render.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    render.add_argument("--set-yaml", default="", help="values to merge, as a YAML mapping")
    commands.add_parser("check", help="check the chart renders the static manifests")
    args = parser.parse_args(argv)
    if args.command == "check":
        return _check()
    print(render_chart(overrides=yaml.safe_load(args.set_yaml) or {}, namespace=args.namespace), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
