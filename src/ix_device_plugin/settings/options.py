"""The daemon's options: every flag and environment variable, checked in one place before anything starts.

Precedence for each: command-line flag > environment variable > default. An error names
the flag or the variable that was actually used. Config settings (`--replicas`, ...) are
parsed here and validated with the config file by `config.resolve`.
"""

from __future__ import annotations

import argparse
import math
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ix_device_plugin import __version__
from ix_device_plugin.apiserver.settings import KubeConfigError, KubeSettings, settings_from
from ix_device_plugin.deviceplugin.endpoint import ENDPOINT
from ix_device_plugin.deviceplugin.features.gpureset import ResetSettings
from ix_device_plugin.hardware.backend import DEFAULT_IXSMI, Backend
from ix_device_plugin.runtime.probes import parse_address
from ix_device_plugin.settings.config import DEFAULT_CONFIG_PATH, SETTINGS, Config, ConfigError, load_file, resolve

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
NODE_CONFIG_LABEL = "iluvatar.com/device-plugin.config"
COMMANDS = ("run", "list", "demo", "check-config", "cdi", "dra")
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
MIN_INTERVAL, MAX_INTERVAL = 0.1, 3600.0
LOG_LEVELS = ("debug", "info", "warning", "error")


class OptionsError(Exception):
    """Some flags or environment variables are invalid; messages holds one line per problem."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("\n".join(messages))
        self.messages = messages


@dataclass(frozen=True)
class Option:
    """One daemon option: its flag, environment variable, default and parser."""

    dest: str
    flag: str
    env: str
    default: str | None
    parse: Callable[[str], Any]
    metavar: str
    help: str


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("expected a non-empty value")
    if "\0" in value:
        raise ValueError("expected text without NUL characters")
    return value


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value.strip().lower() not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value.strip().lower()

    return parse


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError("expected a number of seconds") from None
    if not math.isfinite(seconds) or not MIN_INTERVAL <= seconds <= MAX_INTERVAL:
        raise ValueError(f"expected a number of seconds from {MIN_INTERVAL:g} to {MAX_INTERVAL:g}")
    return seconds


def _dir_or_off(value: str) -> Path | None:
    if value.strip().lower() == "off":
        return None
    return Path(_text(value))


def _seconds_or_off(value: str) -> float | None:
    return None if value.strip().lower() == "off" else _seconds(value)


def _boolean(value: str) -> bool:
    text = value.strip().lower()
    if text not in {"true", "false", "1", "0", "yes", "no", "on", "off"}:
        raise ValueError("expected true or false")
    return text in {"true", "1", "yes", "on"}


def _address(value: str) -> str:
    parse_address(value)  # raises ValueError saying what is expected
    return value


OPTIONS: tuple[Option, ...] = (
    Option(
        "config",
        "--config",
        "IX_CONFIG",
        None,
        _text,
        "PATH",
        f"config file (default {DEFAULT_CONFIG_PATH}; absent means defaults, a named file must exist)",
    ),
    Option(
        "device_plugin_path",
        "--device-plugin-path",
        "IX_DEVICE_PLUGIN_PATH",
        DEFAULT_PLUGIN_DIR,
        _text,
        "DIR",
        "kubelet device plugin directory",
    ),
    Option("backend", "--backend", "IX_BACKEND", "ixml", _choice("ixml", "simulated"), "ixml|simulated", "GPU source"),
    Option(
        "simulated_devices",
        "--simulated-devices",
        "IX_SIMULATED_DEVICES",
        None,
        _text,
        "SPEC|PATH",
        "simulated boards: `BI-V150:2,BI-V100:1` or a YAML file",
    ),
    Option(
        "ixml_library",
        "--ixml-library",
        "IX_IXML_LIBRARY",
        None,
        _text,
        "PATH",
        "path of libixml.so (default: search the CoreX directories)",
    ),
    Option("dev_root", "--dev-root", "IX_DEV_ROOT", "/", _text, "DIR", "directory holding the host's /dev"),
    Option("sysfs_root", "--sysfs-root", "IX_SYSFS_ROOT", "/sys", _text, "DIR", "host sysfs, for NUMA nodes"),
    Option(
        "cdi_spec_dir",
        "--cdi-spec-dir",
        "IX_CDI_SPEC_DIR",
        "/var/run/cdi",
        _dir_or_off,
        "DIR|off",
        "where the CDI spec for the node's chips is written; `off` disables",
    ),
    Option(
        "node_feature_dir",
        "--node-feature-dir",
        "IX_NODE_FEATURE_DIR",
        "/etc/kubernetes/node-feature-discovery/features.d",
        _dir_or_off,
        "DIR|off",
        "where the NFD feature file with the node's GPU labels is written; `off` disables",
    ),
    Option(
        "health_interval",
        "--health-interval",
        "IX_HEALTH_INTERVAL",
        "5",
        _seconds,
        "SECONDS",
        f"seconds between health polls ({MIN_INTERVAL:g} to {MAX_INTERVAL:g})",
    ),
    Option(
        "telemetry_interval",
        "--telemetry-interval",
        "IX_TELEMETRY_INTERVAL",
        "15",
        _seconds_or_off,
        "SECONDS|off",
        "seconds between GPU telemetry passes (ix-exporter's metrics on /metrics); `off` disables",
    ),
    Option(
        "pod_resources_socket",
        "--pod-resources-socket",
        "IX_POD_RESOURCES_SOCKET",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        _dir_or_off,
        "PATH|off",
        "the kubelet's pod-resources socket, to label GPU metrics with the pod holding the GPU; `off` disables",
    ),
    Option(
        "per_node_config",
        "--per-node-config",
        "IX_PER_NODE_CONFIG",
        "false",
        _boolean,
        "true|false",
        f"pick the ConfigMap key named by the node label {NODE_CONFIG_LABEL} (needs NODE_NAME and API access)",
    ),
    Option(
        "kubeconfig",
        "--kubeconfig",
        "KUBECONFIG",
        None,
        _text,
        "PATH",
        "kubeconfig for features that use the API server (default: the in-cluster service account)",
    ),
    Option(
        "backend_timeout",
        "--backend-timeout",
        "IX_BACKEND_TIMEOUT",
        None,
        _seconds,
        "SECONDS",
        "deadline of one GPU library call (default: 3 health intervals, at least 10 s)",
    ),
    Option(
        "ixsmi_path",
        "--ixsmi-path",
        "IX_IXSMI_PATH",
        DEFAULT_IXSMI,
        _text,
        "PATH",
        "ixsmi, which resets chips for flags.reset_gpu",
    ),
    Option(
        "reset_wait_timeout",
        "--reset-wait-timeout",
        "IX_RESET_WAIT_TIMEOUT",
        "60",
        _seconds,
        "SECONDS",
        "flags.reset_gpu: how long to wait for other IXML users (ix-exporter) to let go, and to come back",
    ),
    Option(
        "reset_timeout",
        "--reset-timeout",
        "IX_RESET_TIMEOUT",
        "120",
        _seconds,
        "SECONDS",
        "flags.reset_gpu: how long `ixsmi -r` may take",
    ),
    Option(
        "health_address",
        "--health-address",
        "IX_HEALTH_ADDRESS",
        ":8080",
        _address,
        "HOST:PORT",
        "HTTP /healthz /readyz /metrics; `off` disables",
    ),
    Option("log_level", "--log-level", "IX_LOG_LEVEL", "info", _choice(*LOG_LEVELS), "|".join(LOG_LEVELS), "log level"),
    Option("log_format", "--log-format", "IX_LOG_FORMAT", "text", _choice("text", "json"), "text|json", "log format"),
)
# Options of the DRA mode (`dra`, `list --dra`) only.
DRA_OPTIONS: tuple[Option, ...] = (
    Option("node_name", "--node-name", "NODE_NAME", None, _text, "NAME", "the node this driver runs on (required)"),
    Option(
        "kubelet_registrar_directory_path",
        "--kubelet-registrar-directory-path",
        "KUBELET_REGISTRAR_DIRECTORY_PATH",
        DEFAULT_REGISTRAR_DIR,
        _text,
        "DIR",
        "the kubelet's plugin watcher directory, where the registration socket goes",
    ),
    Option(
        "kubelet_plugins_directory_path",
        "--kubelet-plugins-directory-path",
        "KUBELET_PLUGINS_DIRECTORY_PATH",
        DEFAULT_KUBELET_PLUGINS_DIR,
        _text,
        "DIR",
        "the kubelet's plugins directory, where the DRA socket and the checkpoint go",
    ),
)
OPTIONS_BY_DEST = {option.dest: option for option in OPTIONS}


@dataclass
class Options:
    """Everything the daemon needs to know, already validated."""

    backend_factory: Callable[[], Backend]
    plugin_dir: Path = Path(DEFAULT_PLUGIN_DIR)
    config_path: Path = Path(DEFAULT_CONFIG_PATH)
    config_required: bool = False  # a named file must exist; the default path may be absent
    flags: Mapping[str, Any] = field(default_factory=dict)  # config values from flags, by attr
    env: Mapping[str, str] = field(default_factory=dict)
    dev_root: Path = Path("/")
    sysfs_root: Path = Path("/sys")
    cdi_spec_dir: Path | None = None  # None: no CDI spec is written
    node_feature_dir: Path | None = None  # None: no NFD feature file is written
    health_interval: float = 5.0
    backend_timeout: float | None = None  # None: 3 health intervals, at least 10 s
    health_address: str = ":8080"
    endpoint: str = ENDPOINT
    rediscover_interval: float = 60.0
    poll_interval: float = 1.0  # stat check when inotify wakes us; polling alone uses a quarter
    registration_grace: float = 60.0  # /healthz fails after registration has failed this long
    stop_timeout: float = 1.5  # shutdown abandons what has not stopped by then
    telemetry_interval: float | None = None  # None: no GPU telemetry
    pod_resources_socket: Path | None = None  # None: telemetry without pod labels
    node_name: str = ""  # for metric labels: NODE_NAME, else the host name
    per_node_config: bool = False  # the node label NODE_CONFIG_LABEL picks the ConfigMap key
    kube: KubeSettings | None = None  # how to reach the API server, when a feature needs it or it is at hand
    reset: ResetSettings = field(default_factory=ResetSettings)
    label_wait: float = 5.0  # at start, how long to wait for the node label before using ix-config

    @property
    def call_timeout(self) -> float:
        """The deadline of one backend call."""
        if self.backend_timeout is not None:
            return self.backend_timeout
        return max(3 * self.health_interval, 10.0)

    @property
    def health_stale_after(self) -> float:
        """/healthz fails when the last successful health poll is older than this."""
        return self.call_timeout + 2 * self.health_interval


def config_file_for(options: Options, key: str | None) -> tuple[Path, str]:
    """The config file to read when the node label names key (None: no label), and why, for logs and `list`."""
    default = options.config_path
    if not options.per_node_config:
        return default, f"{default}"
    if key is None:
        return default, f"{default} (node label {NODE_CONFIG_LABEL} not set)"
    named = default.parent / key
    if "/" in key or key.startswith(".") or not named.is_file():
        return default, f"{default} (node label {NODE_CONFIG_LABEL}={key}: no such key in {default.parent})"
    return named, f"{named} (node label {NODE_CONFIG_LABEL}={key})"


def load_config(options: Options, path: Path | None = None) -> tuple[Config, tuple[str, ...]]:
    """The effective configuration (from path, default the configured file) and its warnings; raises ConfigError."""
    path = options.config_path if path is None else path
    file = None
    if path.exists() or options.config_required:
        file = load_file(path)
    config = resolve(file, options.env, options.flags)
    return config, (file.warnings if file is not None else ())


def check_settings(options: Options) -> None:
    """Validate the config settings given as flags and environment variables alone; raises OptionsError."""
    try:
        resolve(None, options.env, options.flags)
    except ConfigError as error:
        raise OptionsError(error.messages) from None


def _add_daemon_flags(
    parser: argparse.ArgumentParser,
    options: Sequence[Option],
    title: str = "node and daemon (flag > environment variable > default)",
) -> None:
    group = parser.add_argument_group(title)
    for option in options:
        default = f"; default {option.default}" if option.default else ""
        help_text = f"{option.help} (env {option.env}{default})"
        group.add_argument(option.flag, dest=option.dest, default=None, metavar=option.metavar, help=help_text)


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("configuration (flag > environment variable > config file > default)")
    for setting in SETTINGS:
        kwargs: dict[str, Any] = {
            "dest": setting.attr,
            "default": None,
            "help": f"{setting.help} (file {setting.key}, env {setting.env})",
        }
        if setting.boolean:
            kwargs.update(nargs="?", const="true", metavar=setting.metavar)
        else:
            kwargs.update(metavar=setting.metavar)
        group.add_argument(setting.flag, **kwargs)


DEMO_OPTIONS = ("config", "simulated_devices", "log_level", "log_format")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser; values are checked afterwards by `resolve_options`."""
    common = argparse.ArgumentParser(add_help=False)
    _add_daemon_flags(common, OPTIONS)
    _add_setting_flags(common)
    parser = argparse.ArgumentParser(
        prog="ix-device-plugin",
        description="Kubernetes device plugin for Iluvatar CoreX GPUs (resource iluvatar.com/gpu).",
    )
    parser.add_argument("--version", action="version", version=f"ix-device-plugin {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("run", parents=[common], help="run the daemon (the default command)")
    lister = sub.add_parser("list", parents=[common], help="print the inventory and what the kubelet would be told")
    lister.add_argument("--output", choices=("text", "json"), default="text")
    demo = sub.add_parser("demo", help="a self-contained round trip on simulated GPUs")
    _add_daemon_flags(demo, [OPTIONS_BY_DEST[dest] for dest in DEMO_OPTIONS])
    demo.add_argument("--output", choices=("text", "json"), default="text")
    cdi = sub.add_parser("cdi", help="Container Device Interface specs")
    cdi_sub = cdi.add_subparsers(dest="cdi_command", metavar="COMMAND", required=True)
    generate = cdi_sub.add_parser(
        "generate", parents=[common], help="print (or write) the CDI spec for this node's chips, without the daemon"
    )
    generate.add_argument("--output", metavar="PATH", help="write the spec here (atomically) instead of printing it")
    lister.add_argument("--dra", action="store_true", help="show the DRA ResourceSlice devices and prepared claims")
    _add_daemon_flags(lister, DRA_OPTIONS, "DRA mode (flag > environment variable > default)")
    dra = sub.add_parser("dra", parents=[common], help="run the DRA kubelet plugin for driver gpu.iluvatar.com")
    _add_daemon_flags(dra, DRA_OPTIONS, "DRA mode (flag > environment variable > default)")
    check = sub.add_parser("check-config", help="validate a config file; exit 0 when valid, 1 otherwise")
    check.add_argument("path", metavar="PATH")
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parsed arguments (raw strings); `run` is implied when no command is given."""
    args = list(argv)
    if not args or (args[0] not in COMMANDS and args[0] not in {"-h", "--help", "--version"}):
        args.insert(0, "run")
    return build_parser().parse_args(args)


def resolve_options(args: argparse.Namespace, env: Mapping[str, str]) -> argparse.Namespace:
    """args with every daemon option parsed from its flag, variable or default; raises OptionsError."""
    values = dict(vars(args))
    errors: list[str] = []
    for option in (*OPTIONS, *DRA_OPTIONS):
        if option.dest not in values:
            continue  # a command that does not take it
        raw, source = values[option.dest], f"flag {option.flag}"
        if raw is None and env.get(option.env, "") != "":
            raw, source = env[option.env], f"environment variable {option.env}"
        if raw is None:
            raw, source = option.default, ""
        if raw is None:
            continue
        try:
            values[option.dest] = option.parse(raw)
        except ValueError as error:
            errors.append(f"{source or 'default of ' + option.flag}: {error}, got {raw!r}")
    if errors:
        raise OptionsError(errors)
    return argparse.Namespace(**values)


def backend_factory(args: argparse.Namespace) -> Callable[[], Backend]:
    """A function creating the backend the arguments ask for."""
    if args.backend == "simulated":
        from ix_device_plugin.hardware.simulated import DEFAULT_SPEC, SimulatedBackend

        return lambda: SimulatedBackend(args.simulated_devices or DEFAULT_SPEC)

    def ixml() -> Backend:
        from ix_device_plugin.hardware.ixml import IxmlBackend

        return IxmlBackend(
            args.ixml_library, dev_root=args.dev_root, sysfs_root=args.sysfs_root, ixsmi_path=args.ixsmi_path
        )

    return ixml


def options_from(args: argparse.Namespace, env: Mapping[str, str]) -> Options:
    """Daemon options from resolved arguments; raises OptionsError for invalid config settings."""
    options = Options(
        backend_factory=backend_factory(args),
        plugin_dir=Path(args.device_plugin_path),
        config_path=Path(args.config or DEFAULT_CONFIG_PATH),
        config_required=args.config is not None,
        flags={s.attr: getattr(args, s.attr) for s in SETTINGS},
        env=env,
        dev_root=Path(args.dev_root),
        sysfs_root=Path(args.sysfs_root),
        cdi_spec_dir=args.cdi_spec_dir,
        node_feature_dir=args.node_feature_dir,
        health_interval=float(args.health_interval),
        backend_timeout=args.backend_timeout,
        health_address=args.health_address,
        telemetry_interval=args.telemetry_interval,
        pod_resources_socket=args.pod_resources_socket,
        node_name=env.get("NODE_NAME") or socket.gethostname(),
        per_node_config=args.per_node_config,
        kube=_kube_settings(args, env),
        reset=ResetSettings(wait_timeout=args.reset_wait_timeout, command_timeout=args.reset_timeout),
    )
    check_settings(options)
    return options


def _kube_settings(args: argparse.Namespace, env: Mapping[str, str]) -> KubeSettings | None:
    """How to reach the API server, when a feature that needs it is on; raises OptionsError saying what is missing."""
    needs = [flag for flag, on in (("--per-node-config", args.per_node_config),) if on]
    if not needs:
        # Not required, but flags.reset_gpu and flags.usevolcano (which a live config change can turn
        # on) use it when at hand.
        try:
            return settings_from(env, args.kubeconfig, "flags.reset_gpu and flags.usevolcano")
        except KubeConfigError:
            return None
    try:
        return settings_from(env, args.kubeconfig, " and ".join(needs))
    except KubeConfigError as error:
        raise OptionsError([str(error)]) from None


@dataclass(frozen=True)
class DraOptions:
    """What the DRA mode needs, already validated: the daemon's options plus the kubelet's directories."""

    base: Options
    node_name: str
    kube: KubeSettings | None  # None only for `list --dra`, which needs no API server
    registrar_dir: Path = Path(DEFAULT_REGISTRAR_DIR)
    plugins_dir: Path = Path(DEFAULT_KUBELET_PLUGINS_DIR)
    claim_read_timeout: float = 10.0  # how long one NodePrepareResources retries reading a claim

    @property
    def cdi_spec_dir(self) -> Path:
        """Where claim CDI specs go (the daemon's --cdi-spec-dir; `off` is refused for DRA)."""
        assert self.base.cdi_spec_dir is not None
        return self.base.cdi_spec_dir


def dra_options_from(args: argparse.Namespace, env: Mapping[str, str], base: Options) -> DraOptions:
    """DRA options from resolved arguments; raises OptionsError naming what is missing or wrong."""
    node = args.node_name
    if not node:
        raise OptionsError(["dra needs the node name: give --node-name or NODE_NAME (downward API spec.nodeName)"])
    if base.cdi_spec_dir is None:
        raise OptionsError(["dra writes a CDI spec per claim: --cdi-spec-dir (IX_CDI_SPEC_DIR) must not be off"])
    try:
        kube = settings_from({**env, "NODE_NAME": node}, args.kubeconfig, "dra")
    except KubeConfigError as error:
        raise OptionsError([str(error)]) from None
    return DraOptions(
        base=base,
        node_name=node,
        kube=kube,
        registrar_dir=Path(args.kubelet_registrar_directory_path),
        plugins_dir=Path(args.kubelet_plugins_directory_path),
    )
