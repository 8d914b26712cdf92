"""Every setting Iluvatar's plugin 4.4.0 reads, read with its meaning (cmd/main.go, pkg/config/config.go).

- Command line (urfave/cli v2 on Go's flag package): bool flags `splitboard`, `usevolcano`, `reset_gpu`, as `-name`
  or `--name`, `-name=value`; values and the variables SPLIT_BOARD, USE_VOLCANO, RESET_GPU as strconv.ParseBool
  reads them; a variable set but empty is false (BoolFlag.Apply); any of them beats the file
  (Flags.UpdateFromCLIFlags, when IsSet).
- /ixconfig/ix-config through sigs.k8s.io/yaml: gopkg.in/yaml.v2 to JSON (a key given twice: the last one; `y`, `n`
  are booleans), then encoding/json (keys match fields in any letter case, unknown keys are ignored, null leaves a
  field as it was, 2.0 fills an int); an empty file is an empty config; sharing.mps is parsed and unused; CheckConfig
  refuses replicas < 0 and reset_gpu with replicas > 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ix_device_plugin.settings.argv import parse_command_line
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.configfile import parse_text
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.options import dra_options_from, load_config
from ix_device_plugin.settings.resolve import Resolved, config_from, resolve
from ix_device_plugin.settings.table import DRA, LIST, RUN, SETTINGS

ORIGIN = "/ixconfig/ix-config"
VARIABLES = {"SPLIT_BOARD": "splitboard", "USE_VOLCANO": "use_volcano", "RESET_GPU": "reset_gpu"}
# strconv.ParseBool's whole vocabulary
PARSE_BOOL = {
    **dict.fromkeys(["1", "t", "T", "TRUE", "true", "True"], True),
    **dict.fromkeys(["0", "f", "F", "FALSE", "false", "False"], False),
}
GO_EXPECTED = (
    "expected true or false as Go's strconv.ParseBool reads them (1 t T TRUE true True 0 f F FALSE false False)"
)
# What our own spellings take and strconv.ParseBool refuses (Iluvatar's plugin 4.4.0 stops at start with each).
NOT_GO = ["yes", "no", "on", "off", "Yes", "tRue", "fALSE", " true", "true ", "1 ", "y", "n", "+1", "01", "truth"]
UPSTREAM_FLAGS = {
    "--splitboard": "splitboard",
    "-splitboard": "splitboard",
    "--usevolcano": "use_volcano",
    "-usevolcano": "use_volcano",
    "--reset_gpu": "reset_gpu",
    "-reset_gpu": "reset_gpu",
}
OURS = {"--use-volcano": "IX_USE_VOLCANO", "--reset-gpu": "IX_RESET_GPU"}


def from_command_line(argv: list[str], env: dict[str, str] | None = None) -> Resolved:
    command = parse_command_line(argv, "0")
    return resolve(command.mode, command.flags, env or {}, command.upstream)


def test_each_name_of_iluvatars_plugin_belongs_to_one_setting() -> None:
    upstream = {setting.name: (setting.upstream_flags, setting.upstream_env) for setting in SETTINGS}
    assert {name: names for name, names in upstream.items() if names != ((), None)} == {
        "splitboard": (("-splitboard",), "SPLIT_BOARD"),  # --splitboard is ours too
        "reset_gpu": (("--reset_gpu", "-reset_gpu"), "RESET_GPU"),
        "use_volcano": (("--usevolcano", "-usevolcano"), "USE_VOLCANO"),
    }
    spelled = [name for setting in SETTINGS for name in (setting.flag, setting.env, *setting.upstream_flags)]
    spelled += [setting.upstream_env for setting in SETTINGS]
    named = [name for name in spelled if name]
    assert len(named) == len(set(named))


@pytest.mark.parametrize("variable", sorted(VARIABLES))
@pytest.mark.parametrize(("text", "value"), sorted(PARSE_BOOL.items()))
def test_each_variable_with_every_value_go_parses(variable: str, text: str, value: bool) -> None:
    settings = resolve(RUN, {}, {variable: text})
    name = VARIABLES[variable]
    assert (settings[name], settings.sources[name]) == (value, f"env {variable}")
    assert settings.given[name] == (value, f"env {variable}")  # so it beats the file


@pytest.mark.parametrize("variable", sorted(VARIABLES))
@pytest.mark.parametrize("text", NOT_GO)
def test_a_variable_of_iluvatars_plugin_takes_only_what_go_parses(variable: str, text: str) -> None:
    with pytest.raises(SettingsError) as caught:
        resolve(RUN, {}, {variable: text})
    assert caught.value.messages == [f"environment variable {variable}: {GO_EXPECTED}, got {text!r}"]


@pytest.mark.parametrize("flag", sorted(UPSTREAM_FLAGS))
@pytest.mark.parametrize("text", NOT_GO)
def test_a_flag_of_iluvatars_plugin_takes_only_what_go_parses(flag: str, text: str) -> None:
    with pytest.raises(SettingsError) as caught:
        from_command_line([f"{flag}={text}"])
    assert caught.value.messages == [f"flag {flag}: {GO_EXPECTED}, got {text!r}"]


@pytest.mark.parametrize("flag", sorted(UPSTREAM_FLAGS))
@pytest.mark.parametrize(("text", "value"), sorted(PARSE_BOOL.items()))
def test_each_flag_of_iluvatars_plugin_with_every_value_go_parses(flag: str, text: str, value: bool) -> None:
    settings = from_command_line([f"{flag}={text}"])
    assert (settings[UPSTREAM_FLAGS[flag]], settings.sources[UPSTREAM_FLAGS[flag]]) == (value, f"flag {flag}")


@pytest.mark.parametrize("flag", sorted(OURS))
def test_our_own_spellings_also_take_yes_no_on_off(flag: str) -> None:
    name = flag.removeprefix("--").replace("-", "_")
    for text, value in {"yes": True, "on": True, " true": True, "TRUE": True, "no": False, "off": False}.items():
        assert from_command_line([f"{flag}={text}"])[name] is value
        assert resolve(RUN, {}, {OURS[flag]: text})[name] is value
    assert resolve(RUN, {}, {"IX_SPLITBOARD": "yes"})["splitboard"] is True


@pytest.mark.parametrize("variable", sorted(VARIABLES))
def test_a_variable_set_empty_is_false_and_beats_the_file(variable: str) -> None:
    name = VARIABLES[variable]
    key = {"splitboard": "flags.splitboard", "use_volcano": "flags.usevolcano", "reset_gpu": "flags.reset_gpu"}[name]
    section, field = key.split(".")
    file = parse_text(f"{section}:\n  {field}: true\n", ORIGIN)
    config = config_from(file, resolve(RUN, {}, {variable: ""}).given)
    assert getattr(config, name) is False
    assert config.sources[name] == f"env {variable}"


@pytest.mark.parametrize(
    ("argv", "name", "value", "source"),
    [
        (["--usevolcano"], "use_volcano", True, "flag --usevolcano"),
        (["-usevolcano"], "use_volcano", True, "flag -usevolcano"),
        (["--usevolcano=false"], "use_volcano", False, "flag --usevolcano"),
        (["-usevolcano=T"], "use_volcano", True, "flag -usevolcano"),
        (["--reset_gpu"], "reset_gpu", True, "flag --reset_gpu"),
        (["-reset_gpu=0"], "reset_gpu", False, "flag -reset_gpu"),
        (["--reset_gpu=True"], "reset_gpu", True, "flag --reset_gpu"),
        (["--splitboard"], "splitboard", True, "flag --splitboard"),
        (["--splitboard=FALSE"], "splitboard", False, "flag --splitboard"),
        (["-splitboard"], "splitboard", True, "flag -splitboard"),
        (["-splitboard=f"], "splitboard", False, "flag -splitboard"),
        (["list", "--usevolcano=1"], "use_volcano", True, "flag --usevolcano"),
    ],
)
def test_each_flag_as_gos_flag_package_takes_it(argv: list[str], name: str, value: bool, source: str) -> None:
    settings = from_command_line(argv)
    assert (settings[name], settings.sources[name]) == (value, source)


def test_a_flag_beats_a_variable_in_either_spelling() -> None:
    settings = from_command_line(["--usevolcano=false", "-splitboard"], {"USE_VOLCANO": "1", "IX_SPLITBOARD": "0"})
    assert (settings["use_volcano"], settings.sources["use_volcano"]) == (False, "flag --usevolcano")
    assert (settings["splitboard"], settings.sources["splitboard"]) == (True, "flag -splitboard")
    assert settings.conflicts == ()  # flag over variable is the one precedence, not a conflict


def test_of_one_kind_ours_wins_and_a_difference_is_noted_once() -> None:
    settings = from_command_line(
        ["--use-volcano=false", "--usevolcano", "--reset-gpu", "--reset_gpu"],
        {"IX_SPLITBOARD": "false", "SPLIT_BOARD": "true", "IX_RESET_GPU": "0", "RESET_GPU": "1"},
    )
    assert (settings["use_volcano"], settings.sources["use_volcano"]) == (False, "flag --use-volcano")
    assert (settings["splitboard"], settings.sources["splitboard"]) == (False, "env IX_SPLITBOARD")
    assert (settings["reset_gpu"], settings.sources["reset_gpu"]) == (True, "flag --reset-gpu")
    assert settings.conflicts == (
        "IX_SPLITBOARD=false and SPLIT_BOARD=true (Iluvatar's plugin 4.4.0's name) differ: using IX_SPLITBOARD",
        "--use-volcano=false and --usevolcano=true (Iluvatar's plugin 4.4.0's name) differ: using --use-volcano",
    )  # reset_gpu: the same value given twice, and the variables lose to the flags


@pytest.mark.parametrize(
    ("env", "argv", "message"),
    [
        ({"SPLIT_BOARD": "si"}, [], f"environment variable SPLIT_BOARD: {GO_EXPECTED}, got 'si'"),
        ({}, ["--usevolcano=maybe"], f"flag --usevolcano: {GO_EXPECTED}, got 'maybe'"),
        ({}, ["-reset_gpu="], f"flag -reset_gpu: {GO_EXPECTED}, got ''"),
    ],
)
def test_a_value_go_cannot_parse_is_refused_naming_where_it_came_from(
    env: dict[str, str], argv: list[str], message: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        from_command_line(argv, env)
    assert caught.value.messages == [message]


def test_the_dra_mode_takes_split_board_and_names_the_variables_it_does_not_use() -> None:
    settings = resolve(DRA, {}, {"SPLIT_BOARD": "true", "USE_VOLCANO": "1", "RESET_GPU": "", "NODE_NAME": "n"})
    assert (settings["splitboard"], settings.sources["splitboard"]) == (True, "env SPLIT_BOARD")
    assert settings.unused_env == ("USE_VOLCANO",)  # RESET_GPU empty: nothing to say
    assert settings.note() == "environment variables dra does not use, ignored: USE_VOLCANO (a device plugin setting)"


def test_the_dra_mode_refuses_a_device_plugin_flag_in_iluvatars_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_command_line(["dra", "--usevolcano"], "0")
    assert caught.value.code == 2
    assert "dra does not use --usevolcano (a device plugin setting)" in capsys.readouterr().err


# ---- the config file --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("flags: {splitBoard: true}\n", Config(splitboard=True)),
        (
            "FLAGS:\n  SPLITBOARD: true\n  UseVolcano: true\n  Reset_GPU: false\n",
            Config(splitboard=True, use_volcano=True),
        ),
        ("ResourceName: example.com/gpu\n", Config(resource_name="example.com/gpu")),
        ("Sharing:\n  TimeSlicing:\n    Replicas: 3\n", Config(replicas=3)),
        (
            "sharing:\n  timeslicing:\n    replicas: 2\n    RenameByDefault: true\n",
            Config(replicas=2, rename_by_default=True),
        ),
        ("flags:\n  \u017fplitboard: true\n", Config(splitboard=True)),  # U+017F folds to s in Go's EqualFold
    ],
)
def test_keys_match_in_any_letter_case(text: str, expected: Config) -> None:
    assert config_from(parse_text(text, ORIGIN), {}) == expected


@pytest.mark.parametrize(
    ("text", "splitboard"),
    [
        # yaml.v2 keeps the last of a key written twice alike
        ("flags:\n  splitboard: true\n  splitboard: false\n", False),
        ("flags:\n  splitboard: maybe\n  splitboard: true\n", True),  # the first is never read
        # encoding/json reads the object's keys in byte order (json.Marshal sorted them): "SplitBoard" < "splitboard"
        ("flags:\n  splitboard: true\n  SplitBoard: false\n", True),
        ("flags:\n  SplitBoard: false\n  splitboard: true\n", True),
        ("flags:\n  splitboard: false\n  SplitBoard: true\n", False),
        # null leaves the field as the key read before it set it
        ("flags:\n  SplitBoard: true\n  splitboard: null\n", True),
    ],
)
def test_a_key_given_twice_is_read_as_iluvatars_plugin_reads_it(text: str, splitboard: bool) -> None:
    file = parse_text(text, ORIGIN)
    assert config_from(file, {}).splitboard is splitboard
    assert any("given 2 times" in warning for warning in file.warnings)


def test_sections_in_other_letter_case_are_merged() -> None:
    file = parse_text("Flags:\n  usevolcano: true\n  splitboard: false\nflags:\n  splitboard: true\n", ORIGIN)
    config = config_from(file, {})
    assert (config.use_volcano, config.splitboard) == (True, True)


@pytest.mark.parametrize(
    "text",
    [
        "sharing:\n  mps:\n    replicas: 4\n",
        "sharing:\n  mps:\n",
        "sharing:\n  mps: {}\n",
        "sharing:\n  mps:\n    replicas: -3\n    failRequestsGreaterThanOne: true\n",
        "sharing:\n  MPS:\n    Replicas: 2.0\n",
    ],
)
def test_sharing_mps_is_read_and_not_acted_on(text: str) -> None:
    file = parse_text(text, ORIGIN)
    assert config_from(file, {}) == Config()
    (warning,) = [warning for warning in file.warnings if "not acted on" in warning]
    assert warning.startswith(f"{ORIGIN}: line 2: sharing.mps: read but not acted on")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sharing:\n  mps: 4\n", "line 2: sharing.mps: expected a mapping, got the value 4"),
        ("sharing:\n  mps:\n    replicas: two\n", "line 3: sharing.mps.replicas: expected a whole number, got 'two'"),
        ("sharing:\n  mps:\n    replicas: 1.5\n", "line 3: sharing.mps.replicas: expected a whole number, got 1.5"),
    ],
)
def test_sharing_mps_of_a_type_iluvatars_plugin_refuses_is_an_error(text: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse_text(text, ORIGIN)
    assert [m for m in caught.value.messages if message in m]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", Config()),
        ("# nothing but a comment\n", Config()),
        ("~\n", Config()),
        ("resourceName:\nflags:\n  splitboard: ~\nsharing:\n  timeSlicing:\n    replicas: null\n", Config()),
        ('resourceName: ""\n', Config()),  # 4.4.0: `if cfg.ResourceName != ""`
        ("flags:\n  splitboard: y\n  usevolcano: Y\n  reset_gpu: n\n", Config(splitboard=True, use_volcano=True)),
        ("sharing:\n  timeSlicing:\n    replicas: 2.0\n", Config(replicas=2)),
        ("sharing:\n  timeSlicing:\n    replicas: 1e1\n", Config(replicas=10)),
        ("unknownKey: 1\nflags:\n  unknownFlag: [1, 2]\n  splitboard: true\n", Config(splitboard=True)),
    ],
)
def test_what_iluvatars_plugin_reads_as_defaults_or_values(text: str, expected: Config) -> None:
    assert config_from(parse_text(text, ORIGIN), {}) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("flags:\n  splitboard: 1\n", "flags.splitboard: expected true or false, got 1"),  # JSON number into bool
        ('flags:\n  splitboard: "true"\n', "flags.splitboard: expected true or false, got 'true'"),
        ("sharing:\n  timeSlicing:\n    replicas: 2.5\n", "replicas: expected a whole number >= 0, got 2.5"),
        ("sharing:\n  timeSlicing:\n    replicas: -1\n", "replicas: expected a whole number >= 0"),  # CheckConfig
        ("flags: []\n", "line 1: flags: expected a mapping, got a list"),
        ("- 1\n", "top level: expected a mapping, got a list"),
    ],
)
def test_what_iluvatars_plugin_refuses_stays_an_error(text: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse_text(text, ORIGIN)
    assert [m for m in caught.value.messages if message in m], caught.value.messages


def test_reset_gpu_with_one_replica_is_refused_as_iluvatars_plugin_refuses_it() -> None:
    file = parse_text("flags:\n  reset_gpu: true\nsharing:\n  timeSlicing:\n    replicas: 1\n", ORIGIN)
    with pytest.raises(SettingsError, match=r"flags.reset_gpu \(file .*\) cannot be combined with .*replicas"):
        config_from(file, {})


def test_the_dra_mode_warns_of_what_it_reads_differently_and_names_the_keys_it_does_not_use(tmp_path: Path) -> None:
    path = tmp_path / "ix-config"
    path.write_text("FLAGS:\n  splitBoard: true\n  usevolcano: true\nsharing:\n  mps: {replicas: 2}\nextra: 1\n")
    options = dra_options_from(resolve(DRA, {"config": str(path)}, {"NODE_NAME": "n"}))
    config, warnings = load_config(options.base)
    assert config.splitboard
    assert warnings == (
        f"{path}: line 1: FLAGS: read as flags (keys match in any letter case, as in Iluvatar's plugin 4.4.0)",
        f"{path}: line 2: flags.splitBoard: read as flags.splitboard (keys match in any letter case, as in "
        "Iluvatar's plugin 4.4.0)",
        f"{path}: line 5: sharing.mps: read but not acted on: GPUs are shared only by sharing.timeSlicing "
        "(Iluvatar's plugin 4.4.0 reads sharing.mps and does nothing with it either)",
        f"{path}: line 6: extra: unknown key, ignored (known here: flags, health, resourceName, sharing)",
        f"{path}: keys dra does not use, ignored: flags.usevolcano (line 3)",
    )


def test_the_device_plugin_modes_read_the_same(tmp_path: Path) -> None:
    path = tmp_path / "ix-config"
    path.write_text("flags: {splitBoard: true}\n")
    for mode in (RUN, LIST):
        from ix_device_plugin.settings.options import options_from

        config, warnings = load_config(options_from(resolve(mode, {"config": str(path)}, {})))
        assert config.splitboard and len(warnings) == 1
