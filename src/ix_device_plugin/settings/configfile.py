"""The ix-config file: its schema, checked with messages naming the file, line and key; ConfigMap manifests."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.table import BY_KEY, Setting
from ix_device_plugin.settings.yamlsafe import MAX_BYTES, YamlError, compose, compose_all, decode, scalar_value, shown

CONFIG_KEY = "ix-config"
# Keys of Iluvatar's Go plugin that this plugin accepts but does not act on.
IGNORED_KEYS: dict[str, str] = {}
_SECTIONS = {"", "flags", "sharing", "sharing.timeSlicing", "health"}


@dataclass(frozen=True)
class FileConfig:
    """Values set by a config file, by key path; warnings about keys accepted but not acted on; and the
    keys (with their lines) of settings the reading mode does not use, which were not parsed."""

    path: str
    values: Mapping[str, Any]
    warnings: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()


def load_file(path: str | Path, mode: str | None = None) -> FileConfig:
    """Read and check a config file (YAML or JSON) for mode (None: every key); SettingsError naming every problem."""
    return parse_bytes(read_bounded(path), str(path), mode=mode)


def read_bounded(path: str | Path) -> bytes:
    """The file's bytes, refusing one larger than a ConfigMap can hold without reading it all; SettingsError."""
    try:
        with Path(path).open("rb") as stream:
            data = stream.read(MAX_BYTES + 1)
    except OSError as error:
        raise SettingsError([f"{path}: cannot read config file: {error.strerror or error}"]) from error
    return data


def parse_bytes(data: bytes, origin: str, line_offset: int = 0, mode: str | None = None) -> FileConfig:
    """Check config bytes (UTF-8); origin names them in messages; raises SettingsError."""
    try:
        text = decode(data)
    except YamlError as error:
        raise SettingsError([f"{origin}: {error}"]) from None
    return parse_text(text, origin, line_offset, mode)


def parse_text(text: str, origin: str, line_offset: int = 0, mode: str | None = None) -> FileConfig:
    """Check config text; origin names it in messages, whose line numbers are shifted by line_offset.
    Keys of settings that mode does not use are listed in `unused`, not parsed."""
    try:
        root = compose(text)
    except YamlError as error:
        raise SettingsError([f"{origin}: {_shifted(str(error), line_offset)}"]) from None
    if root is None:
        raise SettingsError([f"{origin}: the file is empty; expected a mapping such as `flags: {{splitboard: false}}`"])
    walker = _Walker(origin, line_offset, mode)
    walker.walk(root, "")
    if walker.errors:
        raise SettingsError(walker.errors)
    return FileConfig(origin, walker.values, tuple(walker.warnings), tuple(walker.unused))


def _shifted(message: str, line_offset: int) -> str:
    """message with its leading `line N` moved by line_offset (for a config embedded in a manifest)."""
    if line_offset and message.startswith("line "):
        number, _, rest = message[5:].partition(",")
        if number.isdigit():
            return f"line {int(number) + line_offset},{rest}"
    return message


# ---- ConfigMap manifests ----------------------------------------------------------------------


def load_document(data: bytes, origin: str) -> dict[str, FileConfig]:
    """The configurations in a ConfigMap manifest (by data key), or in a bare config file (under ix-config).

    Every data key of a ConfigMap is checked as a configuration (ix-config, and the named ones a node
    label can pick); a manifest without data.ix-config is an error. Raises SettingsError with every problem.
    """
    try:
        documents = compose_all(decode(data))
    except YamlError as error:
        raise SettingsError([f"{origin}: {error}"]) from None
    maps = [document for document in documents if _is_config_map(document)]
    if not maps:
        return {CONFIG_KEY: parse_bytes(data, origin)}
    results: dict[str, FileConfig] = {}
    errors: list[str] = []
    for manifest in maps:
        try:
            results.update(_config_map_data(manifest, origin))
        except SettingsError as error:
            errors.extend(error.messages)
    if not errors and CONFIG_KEY not in results:
        errors.append(f"{origin}: the ConfigMap has no data.{CONFIG_KEY} key, which the plugin reads")
    if errors:
        raise SettingsError(errors)
    return results


def _is_config_map(node: yaml.Node) -> bool:
    if not isinstance(node, yaml.MappingNode):
        return False
    return any(
        isinstance(key, yaml.ScalarNode) and key.value == "kind" and getattr(value, "value", None) == "ConfigMap"
        for key, value in node.value
    )


def _config_map_data(manifest: yaml.MappingNode, origin: str) -> dict[str, FileConfig]:
    data = next((value for key, value in manifest.value if getattr(key, "value", None) == "data"), None)
    if data is None or _is_null(data):
        raise SettingsError([f"{origin}: the ConfigMap has no data"])
    if not isinstance(data, yaml.MappingNode):
        raise SettingsError([f"{origin}: line {data.start_mark.line + 1}: data: expected a mapping of keys to text"])
    results, errors = {}, []
    for key, value in data.value:
        where = f"{origin}: data.{getattr(key, 'value', '?')}"
        if not isinstance(key, yaml.ScalarNode) or not isinstance(value, yaml.ScalarNode):
            errors.append(f"{where}: line {key.start_mark.line + 1}: expected a key with text")
            continue
        # A block scalar's text starts on the line after its `|`; a quoted or plain one on its own line.
        offset = value.start_mark.line + (1 if value.style in {"|", ">"} else 0)
        try:
            results[key.value] = parse_text(value.value, where, offset)
        except SettingsError as error:
            errors.extend(error.messages)
    if errors:
        raise SettingsError(errors)
    return results


# ---- the schema walk --------------------------------------------------------------------------


def _children(prefix: str) -> list[str]:
    """Known names directly under prefix (settings, sections and ignored keys)."""
    names = set()
    for key in (*BY_KEY, *IGNORED_KEYS, *_SECTIONS):
        if key and (key.startswith(prefix + ".") if prefix else True):
            rest = key[len(prefix) + 1 :] if prefix else key
            names.add(rest.split(".")[0])
    return sorted(names)


class _Walker:
    """Walks a composed YAML tree, collecting typed values and located errors."""

    def __init__(self, origin: str, line_offset: int = 0, mode: str | None = None) -> None:
        self.origin = origin
        self.line_offset = line_offset
        self.mode = mode
        self.values: dict[str, Any] = {}
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.unused: list[str] = []

    def line(self, node: yaml.Node) -> int:
        return node.start_mark.line + 1 + self.line_offset

    def where(self, node: yaml.Node, path: str) -> str:
        return f"{self.origin}: line {self.line(node)}: {path}"

    def walk(self, node: yaml.Node, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            label = prefix or "top level"
            self.errors.append(f"{self.where(node, label)}: expected a mapping, got {_node_kind(node)}")
            return
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                label = prefix or "top level"
                self.errors.append(
                    f"{self.where(key_node, label)}: keys must be plain names, got {_node_kind(key_node)}"
                )
                continue
            name = key_node.value
            path = f"{prefix}.{name}" if prefix else name
            if name in seen:
                self.errors.append(
                    f"{self.where(key_node, path)}: given twice, on lines {seen[name]} and {self.line(key_node)}"
                )
                continue
            seen[name] = self.line(key_node)
            self.visit(key_node, value_node, prefix, path)

    def visit(self, key_node: yaml.Node, value_node: yaml.Node, prefix: str, path: str) -> None:
        if path in BY_KEY:
            if BY_KEY[path].used_by(self.mode):
                self.take(BY_KEY[path], value_node)
            else:
                self.unused.append(f"{path} (line {self.line(key_node)})")
        elif path in _SECTIONS:
            if not _is_null(value_node):
                self.walk(value_node, path)
        elif path in IGNORED_KEYS:
            self.warnings.append(f"{self.where(key_node, path)}: ignored: {IGNORED_KEYS[path]}")
        else:
            self.errors.append(f"{self.where(key_node, path)}: unknown key{_suggestion(path, prefix)}")

    def take(self, setting: Setting, node: yaml.Node) -> None:
        assert setting.key is not None
        try:
            value = _scalar_or_list(node)
        except YamlError as error:
            self.errors.append(f"{self.where(node, setting.key)}: {str(error).partition(': ')[2] or error}")
            return
        try:
            self.values[setting.key] = setting.parse(value, False)
        except ValueError as error:
            got = shown(value) if isinstance(node, yaml.ScalarNode) else _node_kind(node)
            self.errors.append(f"{self.where(node, setting.key)}: {error}, got {got}")


def _scalar_or_list(node: yaml.Node) -> Any:
    """A scalar's value, a list of scalars' values, else None (reported as the wrong kind of node)."""
    if isinstance(node, yaml.ScalarNode):
        return scalar_value(node)
    if isinstance(node, yaml.SequenceNode) and all(isinstance(item, yaml.ScalarNode) for item in node.value):
        return [scalar_value(item) for item in node.value]
    return None


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")


def _node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"the value {node.value[:60]}"


def _suggestion(path: str, prefix: str) -> str:
    name = path.rsplit(".", 1)[-1]
    candidates = _children(prefix)
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if not close:
        close = [c for c in candidates if c.lower() == name.lower()]
    known = ", ".join(candidates)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (known here: {known})"
