"""The one precedence: command-line flag > environment variable > config file > default.

Three settings are also read under the names of Iluvatar's plugin 4.4.0 (`--usevolcano`, `SPLIT_BOARD`, ...),
with its meaning: a flag in either spelling beats a variable in either; where both spellings of one kind are
given, ours wins and a differing value is reported once (`Resolved.conflicts`).

Flags and variables are resolved once, at start (`resolve`); the file is read at start and again on
every change, so the ix-config settings given as flags or variables (`Resolved.given`) are laid over
each reading of it (`config_from`). Every problem is one line naming the flag, variable or file line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ix_device_plugin.settings import values
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.configfile import FileConfig
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.table import AMBIENT_ENV, BY_NAME, FILE_SETTINGS, SETTINGS, Setting

# ix-config settings given as flags or environment variables: name -> (value, where it came from).
Given = Mapping[str, tuple[Any, str]]
DEFAULT = "default"


@dataclass(frozen=True)
class Resolved:
    """Every setting a mode takes, typed, with where each came from; and the variables it does not use."""

    mode: str
    values: Mapping[str, Any]
    sources: Mapping[str, str]  # "default", "env <NAME>" or "flag <--name>"
    unused_env: tuple[str, ...] = ()  # set variables of settings the mode does not use
    conflicts: tuple[str, ...] = ()  # a setting given in our spelling and 4.4.0's with different values

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def given(self) -> dict[str, tuple[Any, str]]:
        """The ix-config settings given as flags or variables, which beat the file."""
        return {
            setting.name: (self.values[setting.name], self.sources[setting.name])
            for setting in FILE_SETTINGS
            if self.sources.get(setting.name, DEFAULT) != DEFAULT
        }

    def flag(self, name: str) -> Any:
        """The setting's value when it was given as a flag, else None."""
        return self.values[name] if self.sources.get(name, "").startswith("flag ") else None

    def note(self) -> str | None:
        """The one line saying which variables this mode ignores, or None."""
        if not self.unused_env:
            return None
        listed = ", ".join(f"{name} ({BY_ENV[name].owner(self.mode)})" for name in self.unused_env)
        return f"environment variables {self.mode} does not use, ignored: {listed}"


BY_ENV = {setting.env: setting for setting in SETTINGS if setting.env is not None}
BY_ENV.update({setting.upstream_env: setting for setting in SETTINGS if setting.upstream_env is not None})
Picked = tuple[Any, str]  # a value and where it came from


def resolve(
    mode: str,
    flags: Mapping[str, str | None],
    env: Mapping[str, str],
    upstream: Mapping[str, tuple[str, str]] | None = None,
) -> Resolved:
    """The settings of mode from flags (by setting name; None: not given) over env over defaults; upstream:
    the flags given in 4.4.0's spelling (setting name -> (text, flag as spelled)).

    A variable of a setting the mode does not use is listed in `unused_env`, not parsed. Raises
    SettingsError with one line per bad flag or variable, naming it and the value given.
    """
    upstream = upstream or {}
    resolved: dict[str, Any] = {}
    sources: dict[str, str] = {}
    unused: list[str] = []
    conflicts: list[str] = []
    errors: list[str] = []
    for setting in SETTINGS:
        if not setting.used_by(mode):
            if flags.get(setting.name) is not None or setting.name in upstream:
                errors.append(f"{mode} does not use {setting.flag} ({setting.owner(mode)})")
            for name in (setting.env, setting.upstream_env):
                if name and env.get(name, "") != "" and name not in AMBIENT_ENV:
                    unused.append(name)
            continue
        try:
            resolved[setting.name], sources[setting.name] = _pick(
                setting, flags.get(setting.name), upstream, env, conflicts, mode
            )
        except SettingsError as error:
            errors.extend(error.messages)
    if errors:
        raise SettingsError(errors)
    return Resolved(mode, resolved, sources, tuple(unused), tuple(conflicts))


# Text given, source ("env NAME", "flag --name"), how a message names it, how it is read.
Raw = tuple[str, str, str, values.Parser]


def _pick(
    setting: Setting,
    flag: str | None,
    upstream: Mapping[str, tuple[str, str]],
    env: Mapping[str, str],
    conflicts: list[str],
    mode: str,
) -> Picked:
    """Flag over variable; of one kind, our spelling over 4.4.0's, a differing value noted in conflicts.
    Only what is used is parsed (a bad variable under a flag is not an error)."""
    for mine, theirs in _candidates(setting, flag, upstream, env):
        given = mine if mine is not None else theirs
        if given is None:
            continue
        chosen = _parsed(*given)
        if mine is not None and theirs is not None:
            with contextlib.suppress(SettingsError):
                if (other := _parsed(*theirs))[0] != chosen[0]:
                    conflicts.append(
                        f"{_given(chosen)} and {_given(other)} (Iluvatar's plugin 4.4.0's name) differ: "
                        f"using {chosen[1].split(' ', 1)[1]}"
                    )
        return chosen
    return setting.default_in(mode), DEFAULT


def _candidates(
    setting: Setting, flag: str | None, upstream: Mapping[str, tuple[str, str]], env: Mapping[str, str]
) -> list[tuple[Raw | None, Raw | None]]:
    """(ours, 4.4.0's) for the flag, then for the variable; None where not given.

    4.4.0's spellings (our `--splitboard` too) are read as its command line reads them: with Go's strconv.ParseBool,
    exactly; its variable set but empty means false (urfave/cli's BoolFlag.Apply), and counts as given (it beats the
    config file). Ours set but empty is not given.
    """
    ours, theirs = setting.parse, values.go_bool
    as_flag = theirs if setting.flag_is_upstream else ours
    our_flag = None if flag is None else (flag, f"flag {setting.flag}", f"flag {setting.flag}", as_flag)
    their_flag = None
    if setting.name in upstream:
        text, spelled = upstream[setting.name]
        their_flag = (text, f"flag {spelled}", f"flag {spelled}", theirs)
    raw = env.get(setting.env, "") if setting.env else ""
    our_env = None if raw == "" else (raw, f"env {setting.env}", f"environment variable {setting.env}", ours)
    name = setting.upstream_env
    their_env = None
    if name is not None and name in env:
        their_env = (env[name] or "false", f"env {name}", f"environment variable {name}", theirs)
    return [(our_flag, their_flag), (our_env, their_env)]


def _given(picked: Picked) -> str:
    """`NAME=value` for where a value came from (`env NAME` or `flag --name`)."""
    value, source = picked
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    return f"{source.split(' ', 1)[1]}={shown}"


def _parsed(raw: str, source: str, named: str, parse: values.Parser) -> tuple[Any, str]:
    try:
        return parse(raw, True), source
    except ValueError as error:
        raise SettingsError([f"{named}: {error}, got {raw!r}"]) from None


def config_from(
    file: FileConfig | None,
    given: Given,
    ignored_health_errors: frozenset[str] = frozenset(),
    mode: str | None = None,
) -> Config:
    """The effective Config of mode (None: every setting): given over the file over defaults.

    A setting the mode does not use keeps its default. Raises SettingsError for settings that are each
    valid but cannot go together, naming both and where they came from.
    """
    resolved: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in FILE_SETTINGS:
        assert setting.key is not None
        value, source = setting.default, DEFAULT
        if setting.used_by(mode):
            if file is not None and setting.key in file.values:
                value, source = file.values[setting.key], f"file {file.path}"
            value, source = given.get(setting.name, (value, source))
        resolved[setting.name], sources[setting.name] = value, source
    problems = _conflicts(resolved, sources, file)
    if problems:
        raise SettingsError(problems)
    return Config(**resolved, ignored_health_errors=ignored_health_errors, sources=sources)


def _conflicts(chosen: Mapping[str, Any], sources: Mapping[str, str], file: FileConfig | None) -> list[str]:
    """Settings that are each valid but cannot go together, naming both and where they came from."""

    def named(name: str) -> str:
        return f"{BY_NAME[name].key} ({sources[name]})"

    problems = _health_conflicts(chosen, sources, file)
    if chosen["reset_gpu"] and chosen["replicas"] > 0:
        why = (
            "a shared GPU cannot be reset under the containers that share it"
            if chosen["replicas"] >= 2
            else "Iluvatar's plugin 4.4.0 refuses reset_gpu with any replicas too; 0 gives the same GPUs unshared"
        )
        problems.append(
            f"{named('reset_gpu')} cannot be combined with {named('replicas')} = {chosen['replicas']}: {why}"
        )
    if chosen["replicas"] >= 2 and chosen["rename_by_default"]:
        advertised = f"{chosen['resource_name']}.shared"
        try:
            values.resource_name(advertised)
        except ValueError:
            problems.append(
                f"{named('resource_name')} with {named('rename_by_default')} is advertised as {advertised}, which "
                "is not a valid extended resource name (the part after '/' is at most 63 characters)"
            )
    return problems


def _health_conflicts(chosen: Mapping[str, Any], sources: Mapping[str, str], file: FileConfig | None) -> list[str]:
    """An XID or health error listed for two actions (health.reset, health.operator, health.ignore). Where a list is
    the file's, it is said as the file's other errors are (`<file>: line <n>: <key>: ...`; the later list where both
    are), naming the other list and its line, or its flag or variable."""

    def line(name: str) -> int | None:
        key = BY_NAME[name].key
        if file is None or key is None or sources[name] != f"file {file.path}":
            return None
        return file.lines.get(key)

    lists = ("health_reset", "health_operator", "health_ignore")
    why = "each XID or health error takes one action"
    problems = []
    for index, first in enumerate(lists):
        for second in lists[index + 1 :]:
            both = [name for name in chosen[first] if name in chosen[second]]
            if not both:
                continue
            listed = ", ".join(both)
            said, other = (second, first) if line(second) is not None else (first, second)
            if file is None or (at := line(said)) is None:  # flags and variables only
                problems.append(
                    f"{BY_NAME[first].key} ({sources[first]}) and {BY_NAME[second].key} ({sources[second]}) both "
                    f"list {listed}: {why}"
                )
                continue
            elsewhere = sources[other] if (other_at := line(other)) is None else f"line {other_at}"
            problems.append(
                f"{file.path}: line {at}: {BY_NAME[said].key}: {listed} {'is' if len(both) == 1 else 'are'} in "
                f"{BY_NAME[other].key} too ({elsewhere}): {why}"
            )
    return problems


def describe(config: Config) -> list[tuple[str, Any, str]]:
    """(key, value, source) for every ix-config setting, for `list`."""
    return [
        (setting.key, getattr(config, setting.name), config.sources.get(setting.name, DEFAULT))
        for setting in FILE_SETTINGS
        if setting.key is not None
    ]
