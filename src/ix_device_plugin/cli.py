"""Command line: `ix-device-plugin [run|list|demo|check-config]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ix_device_plugin import __version__
from ix_device_plugin.backends.base import Backend, BackendError
from ix_device_plugin.config import DEFAULT_CONFIG_PATH, SETTINGS, ConfigError, load_file
from ix_device_plugin.lifecycle import Daemon, Options, StartupError, load_config
from ix_device_plugin.logs import setup as setup_logging

log = logging.getLogger("ix_device_plugin")

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
COMMANDS = ("run", "list", "demo", "check-config")


def _env_default(env: Mapping[str, str], name: str, default: Any) -> Any:
    value = env.get(name, "")
    return value if value != "" else default


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _common_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """Flags shared by run, list and demo; defaults come from environment variables."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("node and daemon (flag > environment variable > default)")
    g.add_argument(
        "--config",
        default=env.get("IX_CONFIG") or None,
        metavar="PATH",
        help=f"config file (env IX_CONFIG; default {DEFAULT_CONFIG_PATH}, absent means defaults)",
    )
    g.add_argument(
        "--device-plugin-path",
        default=_env_default(env, "IX_DEVICE_PLUGIN_PATH", DEFAULT_PLUGIN_DIR),
        metavar="DIR",
        help="kubelet device plugin directory (env IX_DEVICE_PLUGIN_PATH)",
    )
    g.add_argument(
        "--backend",
        choices=("ixml", "simulated"),
        default=_env_default(env, "IX_BACKEND", "ixml"),
        help="where devices come from (env IX_BACKEND; default ixml)",
    )
    g.add_argument(
        "--simulated-devices",
        default=env.get("IX_SIMULATED_DEVICES") or None,
        metavar="SPEC|PATH",
        help="simulated boards: `BI-V150:2,BI-V100:1` or a YAML file (env IX_SIMULATED_DEVICES)",
    )
    g.add_argument(
        "--ixml-library",
        default=env.get("IX_IXML_LIBRARY") or None,
        metavar="PATH",
        help="path of libixml.so (env IX_IXML_LIBRARY; default: search the CoreX directories)",
    )
    g.add_argument(
        "--dev-root",
        default=_env_default(env, "IX_DEV_ROOT", "/"),
        metavar="DIR",
        help="directory holding the host's /dev (env IX_DEV_ROOT; default /)",
    )
    g.add_argument(
        "--sysfs-root",
        default=_env_default(env, "IX_SYSFS_ROOT", "/sys"),
        metavar="DIR",
        help="host sysfs, for NUMA nodes (env IX_SYSFS_ROOT; default /sys)",
    )
    g.add_argument(
        "--health-interval",
        type=_positive_float,
        default=_env_default(env, "IX_HEALTH_INTERVAL", "5"),
        metavar="SECONDS",
        help="seconds between health polls (env IX_HEALTH_INTERVAL; default 5)",
    )
    g.add_argument(
        "--health-address",
        default=_env_default(env, "IX_HEALTH_ADDRESS", ":8080"),
        metavar="HOST:PORT",
        help="HTTP /healthz /readyz /metrics; `off` disables (default :8080)",
    )
    g.add_argument(
        "--log-level",
        default=_env_default(env, "IX_LOG_LEVEL", "info"),
        choices=("debug", "info", "warning", "error"),
        help="(env IX_LOG_LEVEL)",
    )
    g.add_argument(
        "--log-format",
        default=_env_default(env, "IX_LOG_FORMAT", "text"),
        choices=("text", "json"),
        help="(env IX_LOG_FORMAT)",
    )
    c = p.add_argument_group("configuration (flag > environment variable > config file > default)")
    for setting in SETTINGS:
        kwargs: dict[str, Any] = {
            "dest": setting.attr,
            "default": None,
            "help": f"{setting.help} (file {setting.key}, env {setting.env})",
        }
        if setting.kind is bool:
            kwargs.update(nargs="?", const="true", metavar="true|false")
        else:
            kwargs.update(metavar=setting.kind.__name__.upper())
        c.add_argument(setting.flag, **kwargs)
    return p


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The full argument parser."""
    common = _common_parser(env)
    parser = argparse.ArgumentParser(
        prog="ix-device-plugin",
        description="Kubernetes device plugin for Iluvatar CoreX GPUs (resource iluvatar.com/gpu).",
    )
    parser.add_argument("--version", action="version", version=f"ix-device-plugin {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("run", parents=[common], help="run the daemon (the default command)")
    lister = sub.add_parser("list", parents=[common], help="print the inventory and what the kubelet would be told")
    lister.add_argument("--output", choices=("text", "json"), default="text")
    demo = sub.add_parser("demo", parents=[common], help="a self-contained round trip on simulated GPUs")
    demo.add_argument("--output", choices=("text", "json"), default="text")
    check = sub.add_parser("check-config", help="validate a config file; exit 0 when valid, 1 otherwise")
    check.add_argument("path", metavar="PATH")
    return parser


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    """Parsed arguments; `run` is implied when no command is given."""
    args = list(argv)
    if not args or (args[0] not in COMMANDS and args[0] not in {"-h", "--help", "--version"}):
        args.insert(0, "run")
    return build_parser(env).parse_args(args)


def backend_factory(args: argparse.Namespace) -> Callable[[], Backend]:
    """A function creating the backend the arguments ask for."""
    if args.backend == "simulated":
        from ix_device_plugin.backends.simulated import DEFAULT_SPEC, SimulatedBackend

        return lambda: SimulatedBackend(args.simulated_devices or DEFAULT_SPEC)

    def ixml() -> Backend:
        from ix_device_plugin.backends.ixml import IxmlBackend

        return IxmlBackend(args.ixml_library, dev_root=args.dev_root, sysfs_root=args.sysfs_root)

    return ixml


def options_from(args: argparse.Namespace, env: Mapping[str, str]) -> Options:
    """Daemon options from parsed arguments."""
    return Options(
        backend_factory=backend_factory(args),
        plugin_dir=Path(args.device_plugin_path),
        config_path=Path(args.config or DEFAULT_CONFIG_PATH),
        config_required=args.config is not None,
        flags={s.attr: getattr(args, s.attr) for s in SETTINGS},
        env=env,
        dev_root=Path(args.dev_root),
        health_interval=float(args.health_interval),
        health_address=args.health_address,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    env = dict(os.environ)
    args = parse_args(sys.argv[1:] if argv is None else argv, env)
    if args.command == "check-config":
        return check_config(args.path)
    setup_logging(args.log_level, args.log_format)
    if args.command == "list":
        return list_command(args, env)
    if args.command == "demo":
        from ix_device_plugin.demo import run_demo

        return run_demo(args, env)
    return run_command(args, env)


def run_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run the daemon until SIGTERM or SIGINT."""
    log.info("ix-device-plugin %s starting (backend %s)", __version__, args.backend)

    async def serve() -> int:
        daemon = Daemon(options_from(args, env))
        daemon.install_signal_handlers()
        return await daemon.run()

    return asyncio.run(serve())


def check_config(path: str) -> int:
    """Validate the config file at path; print every problem."""
    try:
        file = load_file(path)
    except ConfigError as error:
        for message in error.messages:
            print(message, file=sys.stderr)
        print(f"{path}: invalid", file=sys.stderr)
        return 1
    for warning in file.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{path}: valid")
    return 0


def list_command(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print the inventory and the devices the kubelet would be told about."""
    from ix_device_plugin.listing import inventory_report, render_text

    options = options_from(args, env)
    try:
        config = load_config(options)
        backend = options.backend_factory()
        try:
            inventory = backend.discover()
        finally:
            backend.close()
    except (ConfigError, BackendError, StartupError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    report = inventory_report(inventory, config, options)
    print(json.dumps(report, indent=2) if args.output == "json" else render_text(report))
    return 0
