"""Reading structured documents that another process wrote: bounded, plain data, or a clear refusal.

Everything the agent reads from outside (ConfigMap documents, the DRA checkpoint, CDI specs it finds on disk,
a tool's output) goes through here with the same rules as ix-config: a size cap checked before reading the
whole, UTF-8 only, a nesting depth and a value count, and for YAML no aliases, anchors or custom tags. A
refusal is a `DocumentError` whose message says what was wrong (the caller adds where).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ix_device_plugin.settings.yamlsafe import YamlError, compose, scalar_value


class DocumentError(Exception):
    """The document cannot be read as plain data; the message says why."""


@dataclass(frozen=True)
class Limits:
    """How large and how deep a document may be."""

    max_bytes: int = 1024 * 1024
    max_depth: int = 32
    max_values: int = 100_000


DEFAULT_LIMITS = Limits()


def read_file(path: Path, max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file at path, refusing one larger than max_bytes without reading it whole.

    Opened without blocking (a FIFO or a device never hangs or streams forever); with follow_symlinks False a
    symlink is refused too. Raises FileNotFoundError when there is nothing, DocumentError for anything else.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as error:
        if error.errno == 40:  # ELOOP: a symlink where none may be
            raise DocumentError("is a symlink; expected a regular file") from None
        raise DocumentError(f"cannot be read: {error.strerror or error}") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):  # before fdopen, which refuses a directory with an OSError of its own
        os.close(descriptor)
        raise DocumentError(f"is {_kind(mode)}, not a regular file")
    with os.fdopen(descriptor, "rb") as stream:
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DocumentError(f"is larger than {max_bytes:,} bytes")
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device")):
        if test(mode):
            return name
    return "not a regular file" if not stat.S_ISBLK(mode) else "a block device"


def text_of(data: bytes, limits: Limits = DEFAULT_LIMITS) -> str:
    """data as UTF-8 text within limits; DocumentError naming the first bad byte."""
    if len(data) > limits.max_bytes:
        raise DocumentError(f"is {len(data):,} bytes, more than the {limits.max_bytes:,} allowed")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DocumentError(f"byte {data[error.start]:#04x} at offset {error.start} is not UTF-8") from None


def load_json(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """The JSON document in data as plain Python values; DocumentError when it is not one within limits."""
    return load_json_text(text_of(data, limits), limits)


def load_json_text(text: str, limits: Limits = DEFAULT_LIMITS) -> Any:
    """The JSON document in text (already decoded) as plain Python values; DocumentError when it is not one within
    limits (a nest too deep for the parser is refused like one deeper than max_depth, never a RecursionError)."""
    if len(text) > limits.max_bytes:
        raise DocumentError(f"is {len(text):,} characters, more than the {limits.max_bytes:,} allowed")
    try:
        document = json.loads(text)
    except RecursionError:
        raise DocumentError(f"is nested more than {limits.max_depth} levels deep") from None
    except ValueError as error:
        raise DocumentError(f"is not JSON: {error}") from None
    _check_shape(document, limits)
    return document


def load_yaml(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """The single YAML document in data as plain Python values (no aliases, anchors or custom tags)."""
    text = text_of(data, limits)
    try:
        root = compose(text)
        return None if root is None else _plain(root)
    except YamlError as error:
        raise DocumentError(str(error)) from None


def _plain(node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        result = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                raise YamlError(f"line {key.start_mark.line + 1}: keys must be plain values")
            result[scalar_value(key)] = _plain(value)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_plain(item) for item in node.value]
    return scalar_value(node)


def kind_of(value: Any) -> str:
    """What a decoded value is, for messages: an object, a list, a string, a number, a boolean or null."""
    if value is None:
        return "null"
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _check_shape(document: Any, limits: Limits) -> None:
    """Refuse a document deeper than limits.max_depth or with more than limits.max_values values."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    values = 0
    while stack:
        value, depth = stack.pop()
        values += 1
        if values > limits.max_values:
            raise DocumentError(f"holds more than {limits.max_values:,} values")
        if depth > limits.max_depth:
            raise DocumentError(f"is nested more than {limits.max_depth} levels deep")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
