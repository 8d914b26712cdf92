"""The command line: each mode's help lists exactly its settings; a flag of another mode is refused by name."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from ix_device_plugin.settings.argv import CHECK_CONFIG, build_parser, parse_command_line
from ix_device_plugin.settings.table import (
    CDI_GENERATE,
    DEMO,
    DRA,
    LIST,
    LIST_DRA,
    MODES,
    RESET_HELPER,
    RUN,
    SETTINGS,
    Setting,
    settings_of,
)


def help_of(mode: str) -> str:
    return build_parser("0")[1][mode].format_help()


def flags_in(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])-{1,2}[a-z][a-z_-]+", text)) - {"--help", "--output", "--dra"}


def spellings(settings: Iterable[Setting]) -> set[str]:
    """Every flag of settings: ours, and those of Iluvatar's plugin 4.4.0 that are read too (named in the help)."""
    return {flag for s in settings for flag in (s.flag, *s.upstream_flags) if flag}


@pytest.mark.parametrize("mode", [RUN, CDI_GENERATE, DEMO, DRA, RESET_HELPER])
def test_the_help_of_a_mode_lists_exactly_the_flags_it_uses(mode: str) -> None:
    assert flags_in(help_of(mode)) == spellings(settings_of(mode))


def test_dra_help_lists_no_device_plugin_flag() -> None:
    text = help_of(DRA)
    for flag in ("--use-volcano", "--rename-by-default", "--reset-gpu", "--device-plugin-path", "--resource-name"):
        assert flag not in text
    assert "--node-name" in text and "--fail-on-init-error" in text
    assert "IX_DISABLE_HEALTHCHECKS" in text  # variables without a flag are listed too


def test_list_help_shows_what_list_dra_takes_apart() -> None:
    text = help_of(LIST)
    assert flags_in(text) == spellings((*settings_of(LIST), *settings_of(LIST_DRA)))
    assert "with --dra" in text


def test_every_flag_is_taken_by_some_mode() -> None:
    assert spellings(SETTINGS) == set().union(*(flags_in(help_of(mode)) for mode in MODES))


@pytest.mark.parametrize(
    ("argv", "mode"),
    [
        ([], RUN),
        (["--replicas", "2"], RUN),
        (["list", "--dra"], LIST_DRA),
        (["list"], LIST),
        (["cdi", "generate"], CDI_GENERATE),
        (["check-config", "-"], CHECK_CONFIG),
        (["reset-helper"], RESET_HELPER),
    ],
)
def test_the_mode_comes_from_the_command(argv: list[str], mode: str) -> None:
    assert parse_command_line(argv, "0").mode == mode


def test_flags_are_kept_as_given_text() -> None:
    command = parse_command_line(["run", "--splitboard", "--replicas", "3"], "0")
    assert (command.flags["splitboard"], command.flags["replicas"], command.flags["health_interval"]) == (
        "true",
        "3",
        None,
    )
    assert parse_command_line(["cdi", "generate", "--output", "spec.yaml"], "0").output == "spec.yaml"


REFUSALS = [
    (["dra", "--use-volcano", "true"], "ix-device-plugin dra: error: dra does not use --use-volcano (a device plugin"),
    (["dra", "--rename-by-default=true"], "dra does not use --rename-by-default (a device plugin setting)"),
    (["list", "--dra", "--reset-gpu"], "list --dra does not use --reset-gpu (a device plugin setting)"),
    (
        ["list", "--kubelet-plugins-directory-path", "/p"],
        "list does not use --kubelet-plugins-directory-path (used by run",
    ),
    (["cdi", "generate", "--health-interval", "3"], "cdi generate does not use --health-interval (used by run, dra)"),
    (["dra", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["reset-helper", "--config", "/c"], "reset-helper does not use --config (used by run"),
    (["reset-helper", "--kubeconfig", "/k"], "reset-helper does not use --kubeconfig (used by run"),
    (["run", "--max-resets-per-minute", "3"], "run does not use --max-resets-per-minute (used by reset-helper)"),
]


@pytest.mark.parametrize(("argv", "message"), REFUSALS)
def test_a_flag_the_mode_does_not_use_exits_2_naming_it(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_command_line(argv, "0")
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_readme_says_which_command_takes_each_setting() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    table = readme[readme.index("| Flag | Env | Default | Used by |") :].split("\n\n", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    documented: dict[str, frozenset[str]] = {}
    for _flags, variables, _default, used_by in rows:
        modes = frozenset(MODES) if used_by.strip(" |") == "all" else frozenset(used_by.strip(" |").split(", "))
        for variable in re.findall(r"`([A-Z_]+)`", variables):
            documented[variable] = modes
    by_env = {s.env: s.modes for s in SETTINGS if s.env and s.key is None}
    assert {env: documented[env] for env in by_env} == by_env
