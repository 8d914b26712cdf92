"""Reading YAML that an operator or a node hands us, so that no input can hang, crash or exhaust the plugin.

ConfigMaps and device files have no use for YAML's programming features, so they are refused outright:
anchors and aliases (the "billion laughs"), custom and Python tags, the merge key, binary and set types.
Input is bounded before parsing (size), while composing (nesting depth, number of nodes) and before any
number is converted (digit count). Bytes must be UTF-8 (a BOM is allowed). Every refusal is a `YamlError`
with the line and column where it happened.
"""

from __future__ import annotations

import datetime
from typing import Any

import yaml

MAX_BYTES = 1024 * 1024  # a ConfigMap holds at most 1 MiB
MAX_DEPTH = 32
MAX_NODES = 100_000
MAX_DIGITS = 30  # longer numbers are refused before int() or float() sees them
_STANDARD = "tag:yaml.org,2002:"
ALLOWED_TAGS = frozenset(
    _STANDARD + name for name in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp")
)
_NUMBER_TAGS = frozenset(_STANDARD + name for name in ("int", "float"))


class YamlError(Exception):
    """The input cannot be read as plain YAML; the message says where and why."""


def decode(data: bytes) -> str:
    """data as text: UTF-8, a leading BOM allowed; raises YamlError naming the first bad byte."""
    if len(data) > MAX_BYTES:
        raise YamlError(f"is {len(data):,} bytes, more than a ConfigMap can hold ({MAX_BYTES:,} bytes)")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or _alternating_nuls(data[:8]):
        raise YamlError("looks like UTF-16 or UTF-32 text; save it as UTF-8")
    if b"\0" in data:
        raise YamlError(f"holds a NUL byte at offset {data.index(0)}: this is binary data, not YAML")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise YamlError(
            f"byte {data[error.start]:#04x} at offset {error.start} is not UTF-8; save it as UTF-8"
        ) from None
    return text


def _alternating_nuls(head: bytes) -> bool:
    """True for the start of BOM-less UTF-16/32 text such as b'f\\0l\\0': NULs at every other byte only."""
    if len(head) < 4:
        return False
    odd, even = head[1::2], head[0::2]
    return (set(odd) == {0} and 0 not in even) or (set(even) == {0} and 0 not in odd)


class _PlainComposer(yaml.SafeLoader):
    """SafeLoader's composer, refusing aliases, anchors, non-standard tags and deep or huge documents."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _refusal(event, f"alias *{event.anchor}: anchors and aliases are not allowed here")
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _refusal(event, f"anchor &{anchor}: anchors and aliases are not allowed here")
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _refusal(event, f"more than {MAX_NODES:,} values")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _refusal(event, f"nested more than {MAX_DEPTH} levels deep")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        _check_node(node)
        return node


def _check_node(node: yaml.Node) -> None:
    if node.tag == _STANDARD + "merge":
        raise _refusal(node, "the merge key `<<` is not allowed here")
    if node.tag not in ALLOWED_TAGS:
        tag = node.tag.replace(_STANDARD, "!!", 1)
        raise _refusal(node, f"the tag {tag} is not allowed here (only plain values, lists and mappings)")
    if isinstance(node, yaml.ScalarNode) and node.tag in _NUMBER_TAGS and len(node.value) > MAX_DIGITS:
        raise _refusal(node, f"a number of {len(node.value):,} characters (at most {MAX_DIGITS})")


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that is not allowed here."""


def _refusal(item: yaml.Node | yaml.Event, problem: str) -> yaml.MarkedYAMLError:
    return _Refused(problem=problem, problem_mark=item.start_mark)


def compose(text: str) -> yaml.Node | None:
    """The single document in text as a node tree (None when empty); raises YamlError."""
    composer = _composer(text)
    try:
        return composer.get_single_node()
    except yaml.YAMLError as error:
        raise YamlError(describe(error)) from None
    except RecursionError:  # not reached with MAX_DEPTH; kept so no input can ever escape as a traceback
        raise YamlError(f"nested too deep (at most {MAX_DEPTH} levels)") from None
    finally:
        composer.dispose()


def _composer(text: str) -> _PlainComposer:
    """A composer over text; YamlError when its reader refuses a character already (a NUL, a control character)."""
    try:
        return _PlainComposer(text)
    except yaml.YAMLError as error:
        raise YamlError(describe(error)) from None


def compose_all(text: str) -> list[yaml.Node]:
    """Every document in text (a manifest may hold several); raises YamlError."""
    composer = _composer(text)
    try:
        documents = []
        while composer.check_node():
            documents.append(composer.get_node())
        return documents
    except yaml.YAMLError as error:
        raise YamlError(describe(error)) from None
    finally:
        composer.dispose()


_CONSTRUCTOR = yaml.SafeLoader("")


def scalar_value(node: yaml.ScalarNode) -> Any:
    """The Python value of a checked scalar node; raises YamlError when its tag and text disagree (`!!int abc`)."""
    try:
        return _CONSTRUCTOR.construct_object(node)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError):
        kind = node.tag.replace(_STANDARD, "")
        tag = node.tag.replace(_STANDARD, "!!", 1)
        raise YamlError(f"line {node.start_mark.line + 1}: {tag} {node.value[:60]}: not a valid {kind}") from None


def shown(value: Any) -> str:
    """value as YAML would write it (null, true, 2001-12-14, 'text'), kept short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return "'" + text.replace("'", "''") + "'"
    if isinstance(value, datetime.date | int | float):
        return str(value) if not isinstance(value, datetime.datetime) else value.isoformat(sep=" ")
    return type(value).__name__


def describe(error: yaml.YAMLError) -> str:
    """A one-line description of a PyYAML error with its line and column."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    if not isinstance(error, _Refused):
        problem = f"invalid YAML: {problem}"
    if mark is None:
        return problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
