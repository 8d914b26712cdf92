"""The ix-config file's schema, checked with messages naming the file, line and key.

Every file that Iluvatar's plugin 4.4.0 runs with is read, with its meaning: 4.4.0 reads the file with
sigs.k8s.io/yaml (gopkg.in/yaml.v2 to JSON, then encoding/json), so keys match in any letter case, unknown keys
are ignored, a key given twice is read as yaml.v2 and encoding/json read it, a null value or an empty file
leaves the defaults, and `y`/`n` are booleans. Where this plugin would have refused such a file, it is read
and the difference is a warning naming the key and line (`FileConfig.warnings`); `strict` makes those errors
(`check-config --strict`). What 4.4.0 refuses (a wrong type, a negative replicas) is an error either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.table import BY_KEY, Setting
from ix_device_plugin.settings.yamlsafe import (
    MAX_BYTES,
    MAX_DIGITS,
    YamlError,
    compose_all,
    decode,
    scalar_value,
    shown,
)

CONFIG_KEY = "ix-config"
_SECTIONS = {"", "flags", "sharing", "sharing.timeSlicing", "health"}
# A section of Iluvatar's plugin 4.4.0 that it reads, type-checks and does nothing with (config.Sharing.MPS).
MPS = "sharing.mps"
MPS_REPLICAS = "sharing.mps.replicas"
_NOT_ACTED_ON = (
    "read but not acted on: GPUs are shared only by sharing.timeSlicing (Iluvatar's plugin 4.4.0 reads "
    "sharing.mps and does nothing with it either)"
)
_MPS_REFUSED = "MPS sharing is not supported (Iluvatar's plugin 4.4.0 ignores this key); remove it"
# String settings whose empty value means the default (4.4.0: `if cfg.ResourceName != ""`).
_EMPTY_MEANS_DEFAULT = frozenset({"resourceName"})
# Plain scalars that yaml.v2 (4.4.0) reads as booleans or numbers and PyYAML as text (resolve.go).
_YAML_V2_BOOLEANS = {"y": True, "Y": True, "n": False, "N": False}
_YAML_V2_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_YAML_V2_OCTAL = re.compile(r"[-+]?0o[0-7]+")


@dataclass(frozen=True)
class FileConfig:
    """Values set by a config file, by key path; warnings about what was read as Iluvatar's plugin 4.4.0 reads
    it where a stricter reading would refuse it (unknown keys, sharing.mps, an empty file, other letter case, a
    key given twice); and the keys (with their lines) of settings the reading mode does not use, not parsed.
    lines: the line of each key in values, for messages about settings that cannot go together."""

    path: str
    values: Mapping[str, Any]
    warnings: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)


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


def parse_bytes(
    data: bytes, origin: str, line_offset: int = 0, mode: str | None = None, strict: bool = False
) -> FileConfig:
    """Check config bytes (UTF-8); origin names them in messages; raises SettingsError."""
    try:
        text = decode(data)
    except YamlError as error:
        raise SettingsError([f"{origin}: {error}"]) from None
    return parse_text(text, origin, line_offset, mode, strict)


def parse_text(
    text: str, origin: str, line_offset: int = 0, mode: str | None = None, strict: bool = False
) -> FileConfig:
    """Check config text; origin names it in messages, whose line numbers are shifted by line_offset.
    Keys of settings that mode does not use are listed in `unused`, not parsed. strict: what Iluvatar's
    plugin 4.4.0 accepts and a strict reading refuses is an error, not a warning."""
    try:
        documents = compose_all(text)
    except YamlError as error:
        raise SettingsError([f"{origin}: {_shifted(str(error), line_offset)}"]) from None
    walker = _Walker(origin, line_offset, mode, strict)
    root = documents[0] if documents else None
    if len(documents) > 1:
        walker.lenient(
            f"{walker.where(documents[1], 'top level')}: a second YAML document",
            "only the first document is read, as Iluvatar's plugin 4.4.0 reads it",
            "expected one YAML document",
        )
    if root is None or is_null(root):
        walker.lenient(
            f"{origin}: the file is empty",
            "every setting takes its default, as Iluvatar's plugin 4.4.0 reads it",
            "expected a mapping such as `flags: {splitboard: false}`",
        )
    else:
        walker.walk(root, "")
    if walker.errors:
        raise SettingsError(walker.errors)
    return FileConfig(origin, walker.values, tuple(walker.warnings), tuple(walker.unused), walker.lines)


def _shifted(message: str, line_offset: int) -> str:
    """message with its leading `line N` moved by line_offset (for a config embedded in a manifest)."""
    if line_offset and message.startswith("line "):
        number, _, rest = message[5:].partition(",")
        if number.isdigit():
            return f"line {int(number) + line_offset},{rest}"
    return message


# ---- the schema walk --------------------------------------------------------------------------


_KNOWN = frozenset({*BY_KEY, *_SECTIONS, MPS, MPS_REPLICAS} - {""})  # every key path the schema names


def _children(prefix: str) -> list[str]:
    """Known names directly under prefix (settings and sections)."""
    names = set()
    for key in _KNOWN:
        if key.startswith(prefix + ".") if prefix else True:
            rest = key[len(prefix) + 1 :] if prefix else key
            names.add(rest.split(".")[0])
    return sorted(names)


def fold(name: str) -> str:
    """name as Go's encoding/json matches it to a field (bytes.EqualFold: simple case folding), for ASCII names."""
    return "".join("s" if char == "\u017f" else lower if len(lower := char.lower()) == 1 else char for char in name)


Entry = tuple[str, yaml.Node, yaml.Node]  # a key as written, its node, its value's node


class _Walker:
    """Walks a composed YAML tree, collecting typed values, located errors and warnings."""

    def __init__(self, origin: str, line_offset: int = 0, mode: str | None = None, strict: bool = False) -> None:
        self.origin = origin
        self.line_offset = line_offset
        self.mode = mode
        self.strict = strict
        self.values: dict[str, Any] = {}
        self.lines: dict[str, int] = {}
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.unused: list[str] = []

    def line(self, node: yaml.Node) -> int:
        return node.start_mark.line + 1 + self.line_offset

    def where(self, node: yaml.Node, path: str) -> str:
        return f"{self.origin}: line {self.line(node)}: {path}"

    def lenient(self, where: str, warning: str, error: str | None = None) -> None:
        """What Iluvatar's plugin 4.4.0 accepts: a warning saying what is done with it, or with strict an error."""
        if self.strict:
            self.errors.append(f"{where}: {error or warning.partition(';')[0]}")
        else:
            self.warnings.append(f"{where}: {warning}")

    def walk(self, node: yaml.Node, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            label = prefix or "top level"
            self.errors.append(f"{self.where(node, label)}: expected a mapping, got {_node_kind(node)}")
            return
        for entries in self._by_field(node, prefix).values():
            self.visit_field(entries, prefix)

    def _by_field(self, node: yaml.MappingNode, prefix: str) -> dict[str, list[Entry]]:
        """The mapping's entries grouped by the field they fill (keys match in any letter case), in file order."""
        fields: dict[str, list[Entry]] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                label = prefix or "top level"
                self.errors.append(
                    f"{self.where(key_node, label)}: keys must be plain names, got {_node_kind(key_node)}"
                )
                continue
            fields.setdefault(fold(key_node.value), []).append((key_node.value, key_node, value_node))
        return fields

    def visit_field(self, entries: list[Entry], prefix: str) -> None:
        """Read the entries that fill one field as 4.4.0 reads them: of a key written twice alike the last
        (yaml.v2 keeps it), then the spellings in byte order, each over the one before (encoding/json)."""
        spellings: dict[str, Entry] = {}
        for entry in entries:
            spellings[entry[0]] = entry
        canonical = {fold(name): name for name in _children(prefix)}.get(fold(entries[0][0]))
        if len(entries) > 1 and canonical is not None:
            self._report_repeats(entries, spellings, _path(prefix, canonical))
        for name in sorted(spellings):
            _, key_node, value_node = spellings[name]
            written = _path(prefix, name)
            if canonical is None:
                self.lenient(
                    self.where(key_node, written),
                    f"unknown key, ignored{_suggestion(written, prefix)}",
                    f"unknown key{_suggestion(written, prefix)}",
                )
                continue
            path = _path(prefix, canonical)
            if name != canonical:
                self.lenient(
                    self.where(key_node, written),
                    f"read as {path} (keys match in any letter case, as in Iluvatar's plugin 4.4.0)",
                    f"the key is spelled {canonical!r} (Iluvatar's plugin 4.4.0 reads it in any letter case)",
                )
            self.visit(key_node, value_node, path)

    def _report_repeats(self, entries: list[Entry], spellings: dict[str, Entry], path: str) -> None:
        lines = " and ".join(dict.fromkeys(str(self.line(key_node)) for _, key_node, _ in entries))
        last = spellings[max(spellings)][1]
        if len(spellings) == 1:
            how = f"the last one (line {self.line(last)}) is used"
        else:
            kind = "sections are merged, each value" if path in _SECTIONS or path == MPS else "the value"
            how = f"keys in other letter case are read in byte order and {kind} read last wins (line {self.line(last)})"
        self.lenient(
            self.where(entries[-1][1], path),
            f"given {len(entries)} times (line {lines}); as Iluvatar's plugin 4.4.0 reads it, {how}",
            f"given {len(entries)} times (line {lines})",
        )

    def visit(self, key_node: yaml.Node, value_node: yaml.Node, path: str) -> None:
        if path in BY_KEY:
            if BY_KEY[path].used_by(self.mode):
                self.take(BY_KEY[path], value_node)
                self.lines[path] = self.line(key_node)
            else:
                self.unused.append(f"{path} (line {self.line(key_node)})")
        elif path in _SECTIONS or path == MPS:
            if path == MPS:
                self.lenient(self.where(key_node, path), _NOT_ACTED_ON, _MPS_REFUSED)
            if not is_null(value_node):
                self.walk(value_node, path)
        elif path == MPS_REPLICAS:
            self.check_mps_replicas(value_node)

    def take(self, setting: Setting, node: yaml.Node) -> None:
        assert setting.key is not None
        if is_null(node):  # as encoding/json reads null: the field keeps what it had
            return
        try:
            value = _value_of(node)
        except YamlError as error:
            self.errors.append(f"{self.where(node, setting.key)}: {str(error).partition(': ')[2] or error}")
            return
        if value == "" and setting.key in _EMPTY_MEANS_DEFAULT:
            self.values.pop(setting.key, None)
            return
        try:
            self.values[setting.key] = setting.parse(value, False)
        except ValueError as error:
            got = shown(value) if isinstance(node, yaml.ScalarNode) else _node_kind(node)
            self.errors.append(f"{self.where(node, setting.key)}: {error}, got {got}")

    def check_mps_replicas(self, node: yaml.Node) -> None:
        """sharing.mps.replicas is a whole number in 4.4.0's struct (any sign: its checks skip it), or null."""
        if is_null(node):
            return
        try:
            value = _value_of(node)
        except YamlError:
            value = None
        if isinstance(value, float) and value.is_integer():
            return
        if isinstance(value, bool) or not isinstance(value, int):
            got = shown(value) if isinstance(node, yaml.ScalarNode) else _node_kind(node)
            self.errors.append(f"{self.where(node, MPS_REPLICAS)}: expected a whole number, got {got}")


def _value_of(node: yaml.Node) -> Any:
    """The value of a setting's node as yaml.v2 reads it (see _as_yaml_v2_reads); YamlError for a bad tag."""
    value = _scalar_or_list(node)
    if isinstance(value, str) and isinstance(node, yaml.ScalarNode):
        return _as_yaml_v2_reads(node, value)
    return value


def _as_yaml_v2_reads(node: yaml.ScalarNode, text: str) -> Any:
    """A plain scalar that PyYAML read as text, as yaml.v2 reads it: `y`/`n` booleans, `1e3` a float, `0o17` an
    integer; anything else (and anything quoted) stays text."""
    if node.style is not None or len(text) > MAX_DIGITS:  # a longer number is refused as text, not converted
        return text
    if text in _YAML_V2_BOOLEANS:
        return _YAML_V2_BOOLEANS[text]
    if _YAML_V2_OCTAL.fullmatch(text):
        return int(text, 0)
    if _YAML_V2_FLOAT.fullmatch(text):
        return float(text)
    return text


def _path(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _scalar_or_list(node: yaml.Node) -> Any:
    """A scalar's value, a list of scalars' values, else None (reported as the wrong kind of node)."""
    if isinstance(node, yaml.ScalarNode):
        return scalar_value(node)
    if isinstance(node, yaml.SequenceNode) and all(isinstance(item, yaml.ScalarNode) for item in node.value):
        return [scalar_value(item) for item in node.value]
    return None


def is_null(node: yaml.Node) -> bool:
    """Whether node is YAML's null (`null`, `~` or nothing)."""
    return isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")


def _node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"the value {node.value[:60]}"


def _suggestion(path: str, prefix: str) -> str:
    import difflib  # only for a config with an unknown key: the service does without it

    name = path.rsplit(".", 1)[-1]
    candidates = _children(prefix)
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    known = ", ".join(candidates)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (known here: {known})"
