"""The ix-config schema: every bad input gets one precise message naming the file, line and key; check-config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.configfile import load_file, parse_text
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import config_from
from ix_device_plugin.settings.table import DRA

ORIGIN = "/ixconfig/ix-config"
SEED = "flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n    replicas: 4\n"


def errors_of(text: str, strict: bool = False) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        parse_text(text, ORIGIN, strict=strict)
    return caught.value.messages


def test_seed_example_is_valid() -> None:
    file = parse_text(SEED, ORIGIN)
    assert file.values == {"flags.splitboard": False, "sharing.timeSlicing.replicas": 4}
    config = config_from(file, {})
    assert (config.splitboard, config.replicas, config.resource_name) == (False, 4, "iluvatar.com/gpu")


def test_json_loads_too() -> None:
    text = '{"flags": {"splitboard": true}, "sharing": {"timeSlicing": {"replicas": 2, "renameByDefault": true}}}'
    config = config_from(parse_text(text, ORIGIN), {})
    assert config.splitboard and config.replicas == 2
    assert config.advertised_resource_name == "iluvatar.com/gpu.shared"


def test_every_key() -> None:
    text = (
        "resourceName: example.com/ix\nflags:\n  splitboard: true\n  failOnInitError: false\n"
        "sharing:\n  timeSlicing:\n    replicas: 3\n    renameByDefault: true\n"
        "    failRequestsGreaterThanOne: true\n"
    )
    config = config_from(parse_text(text, ORIGIN), {})
    assert config == Config(
        resource_name="example.com/ix",
        splitboard=True,
        fail_on_init_error=False,
        replicas=3,
        rename_by_default=True,
        fail_requests_greater_than_one=True,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sharing:\n  timeSlicing:\n    replicas: four\n",
            f"{ORIGIN}: line 3: sharing.timeSlicing.replicas: expected a whole number >= 0, got 'four'",
        ),
        ("flags:\n  splitboard: maybe\n", f"{ORIGIN}: line 2: flags.splitboard: expected true or false, got 'maybe'"),
        (
            "sharing:\n  timeSlicing:\n    replicas: -1\n",
            "line 3: sharing.timeSlicing.replicas: expected a whole number >= 0",
        ),
        ("sharing:\n  timeSlicing:\n    replicas: 2.5\n", "replicas: expected a whole number >= 0, got 2.5"),
        ("sharing:\n  timeSlicing:\n    replicas: true\n", "replicas: expected a whole number >= 0, got true"),
        ("flags:\n  splitboard: [true]\n", "flags.splitboard: expected true or false, got a list"),
        ("flags: true\n", "line 1: flags: expected a mapping, got the value true"),
        ("- flags\n", "line 1: top level: expected a mapping, got a list"),
        ("flags:\n  splitboard: true\n bad: [\n", f"{ORIGIN}: line 3, column"),
        ("flags: {splitboard: true", "invalid YAML"),
        ("resourceName: gpu\n", "resourceName: expected an extended resource name <domain>/<name>"),
        ("resourceName: kubernetes.io/gpu\n", "outside the kubernetes.io domain"),
    ],
)
def test_bad_input_messages(text: str, message: str) -> None:
    messages = errors_of(text)
    assert len(messages) == 1
    assert message in messages[0]


@pytest.mark.parametrize(
    ("text", "strict_error", "warning"),
    [
        (
            "flags:\n  splitbord: true\n",
            f"{ORIGIN}: line 2: flags.splitbord: unknown key; did you mean 'splitboard'?",
            f"{ORIGIN}: line 2: flags.splitbord: unknown key, ignored; did you mean 'splitboard'?",
        ),
        (
            "sharing:\n  timeSlicing:\n    replicaz: 2\n",
            "line 3: sharing.timeSlicing.replicaz: unknown key; did you mean 'replicas'?",
            "line 3: sharing.timeSlicing.replicaz: unknown key, ignored; did you mean 'replicas'?",
        ),
        ("flag:\n  splitboard: true\n", "line 1: flag: unknown key; did you mean 'flags'?", "flag: unknown key, ign"),
        ("", f"{ORIGIN}: the file is empty: expected a mapping", f"{ORIGIN}: the file is empty: every setting takes"),
        ("# only a comment\n", f"{ORIGIN}: the file is empty", f"{ORIGIN}: the file is empty: every setting"),
        ("~\n", f"{ORIGIN}: the file is empty", f"{ORIGIN}: the file is empty: every setting"),
        (
            "flags:\n  splitBoard: true\n",
            "line 2: flags.splitBoard: the key is spelled 'splitboard'",
            "line 2: flags.splitBoard: read as flags.splitboard (keys match in any letter case",
        ),
        (
            "sharing:\n  mps:\n    replicas: 2\n",
            "line 2: sharing.mps: MPS sharing is not supported",
            "line 2: sharing.mps: read but not acted on",
        ),
        (
            "flags:\n  splitboard: true\n  splitboard: false\n",
            "line 3: flags.splitboard: given 2 times (line 2 and 3)",
            "line 3: flags.splitboard: given 2 times (line 2 and 3); as Iluvatar's plugin 4.4.0 reads it, the last one",
        ),
        (
            "flags: {}\n---\nflags: {}\n",
            "line 3: top level: a second YAML document: expected one YAML document",
            "line 3: top level: a second YAML document: only the first document is read",
        ),
    ],
)
def test_what_iluvatars_plugin_accepts_is_a_warning_and_an_error_only_when_strict(
    text: str, strict_error: str, warning: str
) -> None:
    (error,) = errors_of(text, strict=True)
    assert strict_error in error
    file = parse_text(text, ORIGIN)
    assert any(warning in line for line in file.warnings), file.warnings


def test_all_problems_are_reported_at_once() -> None:
    messages = errors_of("flags:\n  splitbord: true\nsharing:\n  timeSlicing:\n    replicas: four\n", strict=True)
    assert [m.split(": ")[2] for m in messages] == ["flags.splitbord", "sharing.timeSlicing.replicas"]


def test_upstream_keys_are_settings() -> None:
    file = parse_text("flags:\n  usevolcano: true\n  reset_gpu: false\n  splitboard: true\n", ORIGIN)
    assert file.values == {"flags.usevolcano": True, "flags.reset_gpu": False, "flags.splitboard": True}
    assert file.warnings == ()


def test_reset_gpu_with_replicas_names_both_keys() -> None:
    file = parse_text("flags:\n  reset_gpu: true\nsharing:\n  timeSlicing:\n    replicas: 2\n", ORIGIN)
    with pytest.raises(SettingsError) as error:
        config_from(file, {})
    (message,) = error.value.messages
    assert f"flags.reset_gpu (file {ORIGIN}) cannot be combined with sharing.timeSlicing.replicas" in message


def test_a_renamed_resource_name_is_checked_as_advertised() -> None:
    name = "example.com/" + "g" * 60
    file = parse_text(
        f"resourceName: {name}\nsharing:\n  timeSlicing:\n    replicas: 2\n    renameByDefault: true\n", ORIGIN
    )
    with pytest.raises(SettingsError, match=r"is advertised as example.com/g+\.shared, which is not a valid"):
        config_from(file, {})


def test_device_list_strategy_takes_a_list_or_one_name() -> None:
    listed = parse_text("flags:\n  deviceListStrategy: [cdi-cri, device-specs]\n", ORIGIN)
    assert config_from(listed, {}).device_list_strategy == ("cdi-cri", "device-specs")
    with pytest.raises(SettingsError, match="deviceListStrategy"):
        parse_text("flags:\n  deviceListStrategy: [gds]\n", ORIGIN)


def test_null_sections_mean_defaults() -> None:
    assert parse_text("flags:\nsharing:\n", ORIGIN).values == {}


def test_keys_of_settings_a_mode_does_not_use_are_listed_with_their_line_not_parsed() -> None:
    text = "flags:\n  failOnInitError: false\n  reset_gpu: maybe\nsharing:\n  timeSlicing:\n    renameByDefault: 4\n"
    file = parse_text(text, ORIGIN, mode=DRA)
    assert file.values == {"flags.failOnInitError": False}
    assert file.unused == ("flags.reset_gpu (line 3)", "sharing.timeSlicing.renameByDefault (line 6)")
    # an unknown key is a warning in every mode (an error with strict)
    (warning,) = parse_text("flags:\n  splitbord: true\n", ORIGIN, mode=DRA).warnings
    assert "flags.splitbord: unknown key, ignored" in warning


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=f"{tmp_path}/absent: cannot read config file"):
        load_file(tmp_path / "absent")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ix_device_plugin", *args], capture_output=True, text=True, timeout=60)


def test_check_config_valid_and_invalid(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(SEED)
    result = run_cli("check-config", str(good))
    assert result.returncode == 0, result.stderr
    assert f"{good}: valid" in result.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("flags:\n  splitboard: maybe\n")
    result = run_cli("check-config", str(bad))
    assert result.returncode == 1
    assert f"{bad}: line 2: flags.splitboard: expected true or false, got 'maybe'" in result.stderr
    result = run_cli("check-config", str(tmp_path / "absent.yaml"))
    assert result.returncode == 1
    assert "cannot read config file" in result.stderr
