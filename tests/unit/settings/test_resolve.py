"""One table, one precedence (flag > env > file > default), one error type naming where a value came from."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

import ix_device_plugin.settings as settings_package
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.configfile import parse_text
from ix_device_plugin.settings.devicelist import DEVICE_LIST_STRATEGIES, parse_device_list_strategy
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.options import DraOptions, Options, dra_options_from, load_config, options_from
from ix_device_plugin.settings.resolve import config_from, resolve
from ix_device_plugin.settings.table import (
    BY_NAME,
    DRA,
    FILE_SETTINGS,
    LIST,
    LIST_DRA,
    MODES,
    RUN,
    SETTINGS,
    settings_of,
)

ORIGIN = "/ixconfig/ix-config"
SEED = "flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n    replicas: 4\n"

GO_EXPECTED = (
    "expected true or false as Go's strconv.ParseBool reads them (1 t T TRUE true True 0 f F FALSE false False)"
)


def test_one_table_names_each_flag_variable_and_key_once() -> None:
    for attribute in ("name", "flag", "env", "key"):
        given = [getattr(s, attribute) for s in SETTINGS if getattr(s, attribute) is not None]
        assert len(given) == len(set(given)), attribute
    assert all(s.modes and s.modes <= set(MODES) for s in SETTINGS)
    assert all(s.flag or s.env for s in SETTINGS)
    assert {s.name for s in FILE_SETTINGS} == {f.name for f in fields(Config)} - {"ignored_health_errors", "sources"}


def test_the_dra_mode_takes_none_of_the_device_plugins_own_settings() -> None:
    dra = {s.name for s in settings_of(DRA)}
    device_plugin_only = {
        "device_plugin_path", "resource_name", "reset_gpu", "use_volcano", "device_list_strategy",
        "rename_by_default", "fail_requests_greater_than_one", "per_node_config",
    }  # fmt: skip
    assert not dra & device_plugin_only
    assert {"fail_on_init_error", "disabled_healthchecks", "config", "node_name", "cdi_spec_dir"} <= dra
    # the same meaning in both modes: what one GPU is, how many share it, and how a reset goes
    assert {"splitboard", "replicas", "ixsmi_path", "reset_timeout", "reset_wait_timeout"} <= dra
    # the node services both modes run: labels, telemetry and who holds each chip
    assert {"node_feature_dir", "telemetry_interval", "pod_resources_socket"} <= dra


def test_precedence_flag_over_env_over_file_over_default() -> None:
    file = parse_text(SEED, ORIGIN)
    assert config_from(file, {}).sources["replicas"] == f"file {ORIGIN}"
    env = {"IX_REPLICAS": "6", "IX_SPLITBOARD": "true"}
    from_env = config_from(file, resolve(RUN, {}, env).given)
    assert (from_env.replicas, from_env.splitboard) == (6, True)
    assert from_env.sources["replicas"] == "env IX_REPLICAS"
    from_flag = config_from(file, resolve(RUN, {"replicas": "8", "splitboard": "false"}, env).given)
    assert (from_flag.replicas, from_flag.splitboard) == (8, False)
    assert from_flag.sources["splitboard"] == "flag --splitboard"
    assert from_flag.sources["resource_name"] == "default"


def test_node_settings_flag_over_env_over_default() -> None:
    env = {"IX_DEVICE_PLUGIN_PATH": "/from/env", "IX_BACKEND": "simulated", "IX_HEALTH_INTERVAL": "7"}
    settings = resolve(RUN, {}, env)
    assert (settings["device_plugin_path"], settings["backend"], settings["health_interval"]) == (
        Path("/from/env"),
        "simulated",
        7.0,
    )
    assert settings.sources["health_interval"] == "env IX_HEALTH_INTERVAL"
    assert resolve(RUN, {"device_plugin_path": "/from/flag"}, env)["device_plugin_path"] == Path("/from/flag")
    assert resolve(RUN, {}, {})["dev_root"] == BY_NAME["dev_root"].default


def test_bad_env_and_flag_values_are_named_each_on_a_line() -> None:
    env = {"IX_REPLICAS": "lots", "IX_DISABLE_HEALTHCHECKS": "ECC,Fan", "IX_LOG_LEVEL": "trace"}
    with pytest.raises(SettingsError) as caught:
        resolve(RUN, {"splitboard": "perhaps", "health_address": ":99999"}, env)
    assert sorted(caught.value.messages) == sorted(
        [
            "environment variable IX_REPLICAS: expected a whole number >= 0, got 'lots'",
            f"flag --splitboard: {GO_EXPECTED}, got 'perhaps'",  # 4.4.0's flag too: read as Go reads it
            "flag --health-address: expected HOST:PORT, :PORT or off, with a port from 0 to 65535, got ':99999'",
            "environment variable IX_LOG_LEVEL: expected one of debug, info, warning, error, got 'trace'",
            "environment variable IX_DISABLE_HEALTHCHECKS: unknown check 'Fan' (known: all, xids, SYSHUB, MC, "
            "OverTemp, OverVoltage, ECC, Memory, PCIE, or an XID number such as 79), got 'ECC,Fan'",
        ]
    )


def test_a_flag_wins_over_a_bad_variable() -> None:
    assert resolve(RUN, {"replicas": "2"}, {"IX_REPLICAS": "lots"})["replicas"] == 2


def test_variables_a_mode_does_not_use_are_noted_once_not_parsed() -> None:
    env = {"IX_RESET_GPU": "-2", "IX_USE_VOLCANO": "maybe", "IX_HEALTH_INTERVAL": "2", "KUBECONFIG": "/k"}
    settings = resolve(DRA, {}, env)
    assert settings.unused_env == ("IX_RESET_GPU", "IX_USE_VOLCANO")
    assert settings.note() == (
        "environment variables dra does not use, ignored: IX_RESET_GPU (a device plugin setting), "
        "IX_USE_VOLCANO (a device plugin setting)"
    )
    assert settings["health_interval"] == 2.0
    assert resolve(RUN, {}, {"KUBELET_REGISTRAR_DIRECTORY_PATH": "/x"}).note() == (
        "environment variables run does not use, ignored: KUBELET_REGISTRAR_DIRECTORY_PATH (a DRA setting)"
    )
    assert resolve(LIST, {}, {"NODE_NAME": "n", "KUBECONFIG": "/k"}).note() is None


def test_a_flag_of_another_mode_is_refused_naming_it() -> None:
    with pytest.raises(SettingsError, match=r"^dra does not use --use-volcano \(a device plugin setting\)$"):
        resolve(DRA, {"use_volcano": "true"}, {})


def test_device_list_strategy_as_a_variable_is_comma_joined() -> None:
    settings = resolve(RUN, {}, {"IX_DEVICE_LIST_STRATEGY": "cdi-annotations, cdi-cri"})
    assert settings["device_list_strategy"] == ("cdi-annotations", "cdi-cri")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("device-specs", ("device-specs",)),
        ("cdi-cri", ("cdi-cri",)),
        (["cdi-annotations", "device-specs"], ("cdi-annotations", "device-specs")),
        (["cdi-cri", "cdi-cri", " device-specs "], ("cdi-cri", "device-specs")),
    ],
)
def test_device_list_strategy(value: object, expected: tuple[str, ...]) -> None:
    assert parse_device_list_strategy(value) == expected


@pytest.mark.parametrize("value", ["envvar", ["device-specs", "volume-mounts"], [], 3, [None], {"a": 1}])
def test_bad_device_list_strategy_names_the_allowed_values(value: object) -> None:
    with pytest.raises(ValueError) as caught:
        parse_device_list_strategy(value)
    assert all(name in str(caught.value) for name in DEVICE_LIST_STRATEGIES)


def test_disable_healthchecks() -> None:
    assert resolve(RUN, {}, {"IX_DISABLE_HEALTHCHECKS": "all"})["disabled_healthchecks"] == {"all"}
    ignored = resolve(RUN, {}, {"IX_DISABLE_HEALTHCHECKS": "overtemp, ECC"})["disabled_healthchecks"]
    assert ignored == {"OverTemp", "ECC"}
    options = options_from(resolve(RUN, {}, {"IX_DISABLE_HEALTHCHECKS": "79"}))
    assert load_config(options, Path("/nonexistent"))[0].ignored_health_errors == {"XID 79"}


def test_options_are_plain_values() -> None:
    options = options_from(resolve(RUN, {"backend": "simulated", "cdi_spec_dir": "off"}, {"IX_SPLITBOARD": "1"}))
    assert isinstance(options, Options)
    assert (options.backend, options.cdi_spec_dir) == ("simulated", None)
    assert options.node_feature_dir == Path("/etc/kubernetes/node-feature-discovery/features.d")
    assert options.plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert options.given == {"splitboard": (True, "env IX_SPLITBOARD")}
    assert options.node_name  # the host name without NODE_NAME


def test_settings_that_cannot_go_together_are_refused_before_any_file() -> None:
    with pytest.raises(SettingsError, match=r"flags.reset_gpu \(flag --reset-gpu\) cannot be combined"):
        options_from(resolve(RUN, {"reset_gpu": "true", "replicas": "2"}, {}))


def test_dra_options_need_a_node_and_a_cdi_directory() -> None:
    with pytest.raises(SettingsError, match="dra needs the node name: give --node-name or NODE_NAME"):
        dra_options_from(resolve(DRA, {}, {}))
    with pytest.raises(SettingsError, match=r"--cdi-spec-dir .* must not be off"):
        dra_options_from(resolve(DRA, {"cdi_spec_dir": "off"}, {"NODE_NAME": "n"}))
    options = dra_options_from(resolve(DRA, {"fail_on_init_error": "false"}, {"NODE_NAME": "node-a"}))
    assert isinstance(options, DraOptions)
    assert (options.node_name, options.base.mode, options.cdi_spec_dir) == ("node-a", DRA, Path("/var/run/cdi"))
    assert dra_options_from(resolve(LIST_DRA, {}, {})).node_name  # a placeholder for `list --dra`


def test_the_dra_mode_reads_only_its_keys_of_the_config_file_and_says_which_it_ignores(tmp_path: Path) -> None:
    path = tmp_path / "ix-config"
    path.write_text(
        "flags:\n  failOnInitError: false\n  splitboard: true\n  reset_gpu: true\n"
        "sharing:\n  timeSlicing:\n    replicas: 4\n    renameByDefault: true\n"
    )
    options = dra_options_from(resolve(DRA, {"config": str(path)}, {"NODE_NAME": "n"}))
    config, warnings = load_config(options.base)
    assert (config.fail_on_init_error, config.splitboard, config.replicas, config.reset_gpu) == (False, True, 4, False)
    assert warnings == (
        f"{path}: keys dra does not use, ignored: flags.reset_gpu (line 4), "
        "sharing.timeSlicing.renameByDefault (line 8)",
    )


def test_the_settings_package_imports_nothing_else_of_ours() -> None:
    for module in Path(settings_package.__file__).parent.glob("*.py"):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.startswith("ix_device_plugin"):
                    assert name.startswith("ix_device_plugin.settings"), f"{module.name} imports {name}"
