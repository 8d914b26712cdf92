"""The command line: a parser per command with exactly the flags its mode uses, read once.

A flag of another mode is refused naming it and whose it is (exit 2, as argparse exits for a bad flag).
Values stay text here; `resolve` parses them with the environment and the defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ix_device_plugin.settings.table import (
    BY_FLAG,
    CDI_GENERATE,
    DEMO,
    DRA,
    LIST,
    LIST_DRA,
    RESET_HELPER,
    RUN,
    SETTINGS,
    Setting,
    settings_of,
)

CHECK_CONFIG = "check-config"
TEMPLATE = "template"
COMMANDS = ("run", "list", "demo", CHECK_CONFIG, "cdi", "dra", RESET_HELPER, TEMPLATE)
TEMPLATE_ARGUMENTS = ("product", "boards", "config_file", "node", "driver_version")


@dataclass(frozen=True)
class Command:
    """What the command line asks for: a mode, the flags given for its settings, and its own arguments."""

    mode: str  # a mode of the settings table, or check-config
    flags: dict[str, str | None] = field(default_factory=dict)  # setting name -> text given (None: not given)
    # setting name -> (text, the flag as spelled) for the flags given in Iluvatar's plugin 4.4.0's spelling
    upstream: dict[str, tuple[str, str]] = field(default_factory=dict)
    output: str | None = None  # list, demo: text or json; cdi generate: the file to write
    path: str | None = None  # check-config: the file to check
    strict: bool = False  # check-config --strict
    arguments: dict[str, str | None] = field(default_factory=dict)  # template: its own flags, by name (None: not given)


def parse_command_line(argv: Sequence[str], version: str) -> Command:
    """The command argv asks for (`run` when none is named); exits 2 naming a flag the mode does not use.
    version is what `--version` prints."""
    args = list(argv)
    if not args or (args[0] not in COMMANDS and args[0] not in {"-h", "--help", "--version"}):
        args.insert(0, "run")
    parser, commands = build_parser(version)
    namespace, extras = parser.parse_known_args(args)
    mode = _mode(namespace)
    command_parser = commands[mode]
    if extras:
        command_parser.error(_refusal(mode, extras))
    for setting in SETTINGS:  # `list` takes the flags of `list --dra` too, and the other way round
        upstream = getattr(namespace, _upstream_dest(setting), None)
        if upstream is not None and not setting.used_by(mode):
            command_parser.error(_not_used(mode, setting, upstream[1]))
        if getattr(namespace, setting.name, None) is not None and not setting.used_by(mode):
            command_parser.error(_not_used(mode, setting))
    flags = {setting.name: getattr(namespace, setting.name, None) for setting in settings_of(mode) if setting.flag}
    upstream_flags = {
        setting.name: given
        for setting in settings_of(mode)
        if (given := getattr(namespace, _upstream_dest(setting), None)) is not None
    }
    output, path, strict = (getattr(namespace, name, None) for name in ("output", "path", "strict"))
    arguments = {name: getattr(namespace, name) for name in TEMPLATE_ARGUMENTS} if mode == TEMPLATE else {}
    return Command(mode, flags, upstream_flags, output, path, bool(strict), arguments)


def _mode(namespace: argparse.Namespace) -> str:
    if namespace.command == "list":
        return LIST_DRA if namespace.dra else LIST
    if namespace.command == "cdi":
        return CDI_GENERATE
    return str(namespace.command)


def _refusal(mode: str, extras: Sequence[str]) -> str:
    for token in extras:
        spelled = token.split("=", 1)[0]
        setting = BY_FLAG.get(spelled)
        if setting is not None:
            return _not_used(mode, setting, spelled)
    return f"unrecognized arguments: {' '.join(extras)}"


def _not_used(mode: str, setting: Setting, spelled: str | None = None) -> str:
    return f"{mode} does not use {spelled or setting.flag} ({setting.owner(mode)})"


def build_parser(version: str) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser, and the parser of each mode (to report errors with)."""
    parser = argparse.ArgumentParser(
        prog="ix-device-plugin",
        description="Kubernetes device plugin and DRA driver for Iluvatar CoreX GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"ix-device-plugin {version}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="run the device plugin (the default command)", epilog=_env_only(RUN))
    _add_settings(run, settings_of(RUN))
    lister = sub.add_parser(
        "list", help="print the inventory and what the kubelet would be told", epilog=_env_only(LIST)
    )
    _add_settings(lister, settings_of(LIST))
    lister.add_argument("--output", choices=("text", "json"), default="text")
    lister.add_argument("--dra", action="store_true", help="show the DRA ResourceSlice devices and prepared claims")
    with_dra = [s for s in settings_of(LIST_DRA) if not s.used_by(LIST)]
    _add_settings(lister, with_dra, "with --dra (flag > environment variable > default)")
    demo = sub.add_parser("demo", help="a self-contained round trip on simulated GPUs", epilog=_env_only(DEMO))
    _add_settings(demo, settings_of(DEMO))
    demo.add_argument("--output", choices=("text", "json"), default="text")
    cdi = sub.add_parser("cdi", help="Container Device Interface specs")
    cdi_sub = cdi.add_subparsers(dest="cdi_command", metavar="COMMAND", required=True)
    generate = cdi_sub.add_parser(
        "generate", help="print (or write) the CDI spec for this node's chips, without the daemon"
    )
    _add_settings(generate, settings_of(CDI_GENERATE))
    generate.add_argument("--output", metavar="PATH", help="write the spec here (atomically) instead of printing it")
    dra = sub.add_parser("dra", help="run the DRA kubelet plugin for driver gpu.iluvatar.com", epilog=_env_only(DRA))
    _add_settings(dra, settings_of(DRA))
    helper = sub.add_parser(
        RESET_HELPER,
        help="the privileged helper that resets chips (`ixsmi -r`) for the unprivileged agent, over a unix socket",
        epilog=_env_only(RESET_HELPER),
    )
    _add_settings(helper, settings_of(RESET_HELPER), mode=RESET_HELPER)
    check = sub.add_parser(CHECK_CONFIG, help="validate a config file; exit 0 when valid, 1 otherwise")
    check.add_argument("path", metavar="PATH")
    check.add_argument(
        "--strict",
        action="store_true",
        help="also refuse what Iluvatar's plugin 4.4.0 accepts and the plugin reads with a warning (unknown keys, "
        "sharing.mps, an empty file, keys in other letter case or given twice)",
    )
    modes = {RUN: run, LIST: lister, LIST_DRA: lister, DEMO: demo, CDI_GENERATE: generate, DRA: dra}
    modes[RESET_HELPER] = helper
    return parser, {**modes, CHECK_CONFIG: check, TEMPLATE: _template_parser(sub)}


def _template_parser(sub: Any) -> argparse.ArgumentParser:
    """`template`: the ResourceSlices a node of a given shape would publish (its flags are its own, in no table)."""
    template = sub.add_parser(
        TEMPLATE,
        help="print the ResourceSlices a node of a given shape and ix-config would publish (autoscalers' templates)",
    )
    template.add_argument("--product", required=True, help="the boards' product, e.g. BI-V150")
    template.add_argument("--boards", required=True, metavar="N", help="how many boards the node has")
    template.add_argument(
        "--config", dest="config_file", metavar="PATH", help="the node's ix-config file (default: the defaults)"
    )
    template.add_argument("--node", metavar="NAME", help="the node name the slices and their pool carry")
    template.add_argument("--driver-version", metavar="V", help="the CoreX driver version the node reports")
    template.add_argument("--output", choices=("yaml", "json"), default="yaml")
    return template


def _add_settings(
    parser: argparse.ArgumentParser, settings: Iterable[Setting], title: str | None = None, mode: str | None = None
) -> None:
    node = [s for s in settings if s.flag and s.key is None]
    config = [s for s in settings if s.flag and s.key is not None]
    if node:
        group = parser.add_argument_group(title or "node and daemon (flag > environment variable > default)")
        for setting in node:
            shown = _shown(setting.default_in(mode))
            help_text = f"{setting.help} (env {setting.env}{f'; default {shown}' if shown else ''})"
            _add_flag(group, setting, help_text)
    if config:
        group = parser.add_argument_group("configuration (flag > environment variable > config file > default)")
        for setting in config:
            _add_flag(
                group, setting, f"{setting.help} (file {setting.key}, env {setting.env}{_upstream_help(setting)})"
            )


def _add_flag(group: Any, setting: Setting, help_text: str) -> None:
    kwargs: dict[str, Any] = {"dest": setting.name, "default": None, "metavar": setting.metavar, "help": help_text}
    if setting.boolean:
        kwargs.update(nargs="?", const="true")
    group.add_argument(setting.flag, **kwargs)
    if setting.upstream_flags:
        group.add_argument(
            *setting.upstream_flags,
            dest=_upstream_dest(setting),
            default=None,
            nargs="?",
            const="true",
            action=_Spelled,
            help=argparse.SUPPRESS,
        )


def _upstream_dest(setting: Setting) -> str:
    return f"upstream_{setting.name}"


def _upstream_help(setting: Setting) -> str:
    """Where the help names the spellings of Iluvatar's plugin 4.4.0 that are read too."""
    names = [name for name in (*setting.upstream_flags, setting.upstream_env) if name]
    return f"; also 4.4.0's {', '.join(names)}" if names else ""


class _Spelled(argparse.Action):
    """Keeps the value with the flag as it was spelled (`-usevolcano` or `--usevolcano`), for messages."""

    def __call__(
        self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        setattr(namespace, self.dest, (values, option_string or self.option_strings[0]))


def _env_only(mode: str) -> str | None:
    settings = [s for s in settings_of(mode) if s.flag is None and s.env]
    if not settings:
        return None
    return "environment only: " + "; ".join(f"{s.env}: {s.help}" for s in settings)


def _shown(value: Any) -> str:
    """A default as it is written on the command line."""
    if value is None or value == frozenset():
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value) if not isinstance(value, Path) else value.as_posix()
