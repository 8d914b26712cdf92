"""The ix-config file: schema, validation with precise messages, and precedence.

Precedence for every setting: command-line flag > environment variable > file > default.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ix_device_plugin.core.cdi import DEVICE_SPECS, parse_device_list_strategy
from ix_device_plugin.core.inventory import HEALTH_ERROR_NAMES, IGNORE_ALL, IGNORE_XIDS, xid_name
from ix_device_plugin.settings.yamlsafe import MAX_BYTES, YamlError, compose, compose_all, decode, scalar_value, shown

DEFAULT_CONFIG_PATH = "/ixconfig/ix-config"
DEFAULT_RESOURCE_NAME = "iluvatar.com/gpu"
DISABLE_HEALTHCHECKS_ENV = "IX_DISABLE_HEALTHCHECKS"
# Keys of Iluvatar's Go plugin that this plugin accepts but does not act on.
IGNORED_KEYS: dict[str, str] = {}
_RESOURCE_NAME = re.compile(
    r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


# A setting's parser: (value, from_text) -> the typed value, or ValueError saying what was expected.
# from_text is True for flags and environment variables, whose values are always strings.
Parser = Callable[[Any, bool], Any]


@dataclass(frozen=True)
class Setting:
    """One configurable value: its key path in the file, env var, flag, parser and default."""

    attr: str
    key: str
    env: str
    flag: str
    parse: Parser
    default: Any
    help: str
    metavar: str

    @property
    def boolean(self) -> bool:
        """True for a true/false setting (its flag may be given without a value)."""
        return self.parse is _coerce_bool


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
MAX_REPLICAS = 1024


def _coerce_bool(value: Any, from_text: bool) -> bool:
    if isinstance(value, bool):
        return value
    if from_text and isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError("expected true or false")


def _coerce_replicas(value: Any, from_text: bool) -> int:
    if from_text and isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isascii() and text.lstrip("-").isdigit() and len(text) <= 12:
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("expected a whole number >= 0")
    if value < 0:
        raise ValueError("expected a whole number >= 0 (0 or 1 means no sharing)")
    if value > MAX_REPLICAS:
        raise ValueError(f"expected at most {MAX_REPLICAS} replicas per GPU")
    return value


def _coerce_resource_name(value: Any, from_text: bool = False) -> str:
    if not isinstance(value, str) or not _RESOURCE_NAME.match(value):
        raise ValueError("expected an extended resource name <domain>/<name>, such as iluvatar.com/gpu")
    if value.split("/", 1)[0] in {"kubernetes.io", "k8s.io"} or value.split("/", 1)[0].endswith(".kubernetes.io"):
        raise ValueError("expected an extended resource name outside the kubernetes.io domain")
    return value


def _coerce_strategy(value: Any, from_text: bool) -> tuple[str, ...]:
    if from_text and isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    return parse_device_list_strategy(value)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "resource_name",
        "resourceName",
        "IX_RESOURCE_NAME",
        "--resource-name",
        _coerce_resource_name,
        DEFAULT_RESOURCE_NAME,
        "extended resource name advertised to the kubelet",
        "NAME",
    ),
    Setting(
        "splitboard",
        "flags.splitboard",
        "IX_SPLITBOARD",
        "--splitboard",
        _coerce_bool,
        False,
        "advertise every chip of a multi-chip board (BI-V150) as its own GPU",
        "true|false",
    ),
    Setting(
        "fail_on_init_error",
        "flags.failOnInitError",
        "IX_FAIL_ON_INIT_ERROR",
        "--fail-on-init-error",
        _coerce_bool,
        True,
        "exit when the GPU library cannot start; false advertises 0 GPUs and retries",
        "true|false",
    ),
    Setting(
        "reset_gpu",
        "flags.reset_gpu",
        "IX_RESET_GPU",
        "--reset-gpu",
        _coerce_bool,
        False,
        "reset the chips (ixsmi -r) before a container gets them; needs NODE_NAME and API access",
        "true|false",
    ),
    Setting(
        "use_volcano",
        "flags.usevolcano",
        "IX_USE_VOLCANO",
        "--use-volcano",
        _coerce_bool,
        False,
        "Volcano scheduling mode: give each pod the devices the scheduler chose; needs NODE_NAME and API access",
        "true|false",
    ),
    Setting(
        "device_list_strategy",
        "flags.deviceListStrategy",
        "IX_DEVICE_LIST_STRATEGY",
        "--device-list-strategy",
        _coerce_strategy,
        (DEVICE_SPECS,),
        "how Allocate names devices: device-specs, cdi-cri, cdi-annotations (a list, comma-joined as a flag)",
        "LIST",
    ),
    Setting(
        "replicas",
        "sharing.timeSlicing.replicas",
        "IX_REPLICAS",
        "--replicas",
        _coerce_replicas,
        0,
        f"time-slicing replicas per GPU (0 or 1: no sharing; at most {MAX_REPLICAS})",
        "INT",
    ),
    Setting(
        "rename_by_default",
        "sharing.timeSlicing.renameByDefault",
        "IX_RENAME_BY_DEFAULT",
        "--rename-by-default",
        _coerce_bool,
        False,
        "advertise shared GPUs as <resourceName>.shared",
        "true|false",
    ),
    Setting(
        "fail_requests_greater_than_one",
        "sharing.timeSlicing.failRequestsGreaterThanOne",
        "IX_FAIL_REQUESTS_GREATER_THAN_ONE",
        "--fail-requests-greater-than-one",
        _coerce_bool,
        False,
        "refuse a container asking for more than one shared replica",
        "true|false",
    ),
)
SETTINGS_BY_KEY = {setting.key: setting for setting in SETTINGS}
SETTINGS_BY_ATTR = {setting.attr: setting for setting in SETTINGS}


@dataclass(frozen=True)
class Config:
    """The validated configuration the planner and server act on."""

    resource_name: str = DEFAULT_RESOURCE_NAME
    splitboard: bool = False
    fail_on_init_error: bool = True
    reset_gpu: bool = False
    use_volcano: bool = False
    device_list_strategy: tuple[str, ...] = (DEVICE_SPECS,)
    replicas: int = 0
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    # Health error names not to act on (IX_DISABLE_HEALTHCHECKS); "all" ignores every error and XID,
    # "xids" every XID event, "XID <n>" that XID (besides the application XIDs always ignored).
    ignored_health_errors: frozenset[str] = frozenset()
    # Where each value came from: "default", "file <path>", "env <NAME>" or "flag <--name>".
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def shared(self) -> bool:
        """True when devices are advertised as several time-sliced replicas."""
        return self.replicas >= 2

    @property
    def advertised_resource_name(self) -> str:
        """The resource name the kubelet is told, `.shared` appended when renaming."""
        if self.shared and self.rename_by_default:
            return f"{self.resource_name}.shared"
        return self.resource_name


class ConfigError(Exception):
    """The configuration is invalid; messages holds one line per problem."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


@dataclass(frozen=True)
class FileConfig:
    """Values set by a config file, by key path, plus warnings about ignored keys."""

    path: str
    values: Mapping[str, Any]
    warnings: tuple[str, ...] = ()


def load_file(path: str | Path) -> FileConfig:
    """Read and validate a config file (YAML or JSON); raises ConfigError naming every problem."""
    return parse_bytes(read_bounded(path), str(path))


def read_bounded(path: str | Path) -> bytes:
    """The file's bytes, refusing one larger than a ConfigMap can hold without reading it all; ConfigError."""
    try:
        with Path(path).open("rb") as stream:
            data = stream.read(MAX_BYTES + 1)
    except OSError as error:
        raise ConfigError([f"{path}: cannot read config file: {error.strerror or error}"]) from error
    return data


def parse_bytes(data: bytes, origin: str, line_offset: int = 0) -> FileConfig:
    """Validate config bytes (UTF-8); origin names them in messages; raises ConfigError."""
    try:
        text = decode(data)
    except YamlError as error:
        raise ConfigError([f"{origin}: {error}"]) from None
    return parse_text(text, origin, line_offset)


def parse_text(text: str, origin: str, line_offset: int = 0) -> FileConfig:
    """Validate config text; origin names it in messages, whose line numbers are shifted by line_offset."""
    try:
        root = compose(text)
    except YamlError as error:
        raise ConfigError([f"{origin}: {_shifted(str(error), line_offset)}"]) from None
    if root is None:
        raise ConfigError([f"{origin}: the file is empty; expected a mapping such as `flags: {{splitboard: false}}`"])
    walker = _Walker(origin, line_offset)
    walker.walk(root, "")
    if walker.errors:
        raise ConfigError(walker.errors)
    return FileConfig(path=origin, values=walker.values, warnings=tuple(walker.warnings))


def _shifted(message: str, line_offset: int) -> str:
    """message with its leading `line N` moved by line_offset (for a config embedded in a manifest)."""
    if line_offset and message.startswith("line "):
        number, _, rest = message[5:].partition(",")
        if number.isdigit():
            return f"line {int(number) + line_offset},{rest}"
    return message


# ---- ConfigMap manifests ----------------------------------------------------------------------

CONFIG_KEY = "ix-config"


def load_document(data: bytes, origin: str) -> dict[str, FileConfig]:
    """The configurations in a ConfigMap manifest (by data key), or in a bare config file (under ix-config).

    Every data key of a ConfigMap is checked as a configuration (ix-config, and the named ones a node
    label can pick); a manifest without data.ix-config is an error. Raises ConfigError with every problem.
    """
    try:
        documents = compose_all(decode(data))
    except YamlError as error:
        raise ConfigError([f"{origin}: {error}"]) from None
    maps = [document for document in documents if _is_config_map(document)]
    if not maps:
        return {CONFIG_KEY: parse_bytes(data, origin)}
    results: dict[str, FileConfig] = {}
    errors: list[str] = []
    for manifest in maps:
        try:
            results.update(_config_map_data(manifest, origin))
        except ConfigError as error:
            errors.extend(error.messages)
    if not errors and CONFIG_KEY not in results:
        errors.append(f"{origin}: the ConfigMap has no data.{CONFIG_KEY} key, which the plugin reads")
    if errors:
        raise ConfigError(errors)
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
        raise ConfigError([f"{origin}: the ConfigMap has no data"])
    if not isinstance(data, yaml.MappingNode):
        raise ConfigError([f"{origin}: line {data.start_mark.line + 1}: data: expected a mapping of keys to text"])
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
        except ConfigError as error:
            errors.extend(error.messages)
    if errors:
        raise ConfigError(errors)
    return results


_SECTIONS = {"", "flags", "sharing", "sharing.timeSlicing"}


def _children(prefix: str) -> list[str]:
    """Known names directly under prefix (settings, sections and ignored keys)."""
    names = set()
    for key in (*SETTINGS_BY_KEY, *IGNORED_KEYS, *_SECTIONS):
        if key and (key.startswith(prefix + ".") if prefix else True):
            rest = key[len(prefix) + 1 :] if prefix else key
            names.add(rest.split(".")[0])
    return sorted(names)


class _Walker:
    """Walks a composed YAML tree, collecting typed values and located errors."""

    def __init__(self, origin: str, line_offset: int = 0) -> None:
        self.origin = origin
        self.line_offset = line_offset
        self.values: dict[str, Any] = {}
        self.errors: list[str] = []
        self.warnings: list[str] = []

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
        if path in SETTINGS_BY_KEY:
            self.take(SETTINGS_BY_KEY[path], value_node)
        elif path in _SECTIONS:
            if not _is_null(value_node):
                self.walk(value_node, path)
        elif path in IGNORED_KEYS:
            self.warnings.append(f"{self.where(key_node, path)}: ignored: {IGNORED_KEYS[path]}")
        else:
            self.errors.append(f"{self.where(key_node, path)}: unknown key{_suggestion(path, prefix)}")

    def take(self, setting: Setting, node: yaml.Node) -> None:
        try:
            value = _scalar_or_list(node)
        except YamlError as error:
            self.errors.append(f"{self.where(node, setting.key)}: {str(error).partition(': ')[2] or error}")
            return
        try:
            self.values[setting.key] = coerce(setting, value, from_text=False)
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


def coerce(setting: Setting, value: Any, *, from_text: bool) -> Any:
    """value checked and converted by setting's parser; raises ValueError saying what was expected."""
    return setting.parse(value, from_text)


def resolve(
    file: FileConfig | None,
    env: Mapping[str, str],
    flags: Mapping[str, Any],
) -> Config:
    """The effective Config: flags (by attr name) over env over file over defaults."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    errors: list[str] = []
    for setting in SETTINGS:
        value, source = setting.default, "default"
        if file is not None and setting.key in file.values:
            value, source = file.values[setting.key], f"file {file.path}"
        if env.get(setting.env, "") != "":
            try:
                value, source = coerce(setting, env[setting.env], from_text=True), f"env {setting.env}"
            except ValueError as error:
                errors.append(f"environment variable {setting.env}: {error}, got {env[setting.env]!r}")
        if flags.get(setting.attr) is not None:
            try:
                value, source = coerce(setting, flags[setting.attr], from_text=True), f"flag {setting.flag}"
            except ValueError as error:
                errors.append(f"flag {setting.flag}: {error}, got {flags[setting.attr]!r}")
        values[setting.attr] = value
        sources[setting.attr] = source
    ignored = _ignored_health_errors(env.get(DISABLE_HEALTHCHECKS_ENV, ""), errors)
    if not errors:
        errors.extend(_conflicts(values, sources))
    if errors:
        raise ConfigError(errors)
    return Config(**values, ignored_health_errors=ignored, sources=sources)


def _conflicts(values: Mapping[str, Any], sources: Mapping[str, str]) -> list[str]:
    """Settings that are each valid but cannot go together, naming both and where they came from."""

    def named(attr: str) -> str:
        return f"{SETTINGS_BY_ATTR[attr].key} ({sources[attr]})"

    problems = []
    if values["reset_gpu"] and values["replicas"] > 0:
        problems.append(
            f"{named('reset_gpu')} cannot be combined with {named('replicas')} = {values['replicas']}: "
            "a shared GPU cannot be reset under the containers that share it"
        )
    if values["replicas"] >= 2 and values["rename_by_default"]:
        advertised = f"{values['resource_name']}.shared"
        try:
            _coerce_resource_name(advertised)
        except ValueError:
            problems.append(
                f"{named('resource_name')} with {named('rename_by_default')} is advertised as {advertised}, which "
                "is not a valid extended resource name (the part after '/' is at most 63 characters)"
            )
    return problems


def _ignored_health_errors(text: str, errors: list[str]) -> frozenset[str]:
    """Parse IX_DISABLE_HEALTHCHECKS: a comma list of `all`, `xids`, IXML health error names and XID numbers."""
    by_lower = {name.lower(): name for name in (*HEALTH_ERROR_NAMES, IGNORE_ALL, IGNORE_XIDS)}
    names: set[str] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        name = by_lower.get(item.lower()) or _xid_item(item)
        if name is None:
            known = ", ".join((IGNORE_ALL, IGNORE_XIDS, *HEALTH_ERROR_NAMES))
            errors.append(
                f"environment variable {DISABLE_HEALTHCHECKS_ENV}: unknown check {item!r} "
                f"(known: {known}, or an XID number such as 79)"
            )
        else:
            names.add(name)
    return frozenset(names)


def _xid_item(item: str) -> str | None:
    """`XID <n>` for an XID number (`79`, `xid79`, `XID 79`), None for anything else."""
    digits = item.lower().removeprefix("xid").strip()
    if not digits.isdigit() or not digits.isascii():
        return None
    xid = int(digits)
    return xid_name(xid) if 0 < xid < 2**32 else None


def describe(config: Config) -> list[tuple[str, Any, str]]:
    """(key, value, source) for every setting, for `list`."""
    return [
        (setting.key, getattr(config, setting.attr), config.sources.get(setting.attr, "default"))
        for setting in SETTINGS
    ]
