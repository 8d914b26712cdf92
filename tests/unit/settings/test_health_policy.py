"""The health policy: one table of what is done about each XID and health error, changed by ix-config's `health:`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ix_device_plugin.core.inventory import Board, Chip, ChipStatus, Inventory
from ix_device_plugin.core.plan import plan
from ix_device_plugin.dra.slices import slice_content
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.configfile import parse_text
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.health import (
    DEFAULT_IGNORED_XIDS,
    HEALTH_ERROR_NAMES,
    HEALTH_POLICY,
    IGNORE,
    NOT_PRESENT,
    OPERATOR,
    RESET,
    HealthPolicy,
    is_xid,
    xid_label,
    xid_name,
)
from ix_device_plugin.settings.resolve import config_from, resolve
from ix_device_plugin.settings.table import DRA, RUN

pytestmark = pytest.mark.unit
ORIGIN = "/ixconfig/ix-config"


def test_the_table_names_each_entry_once_and_covers_every_health_error() -> None:
    names = [row.name for row in HEALTH_POLICY]
    assert len(names) == len(set(names))
    assert set(HEALTH_ERROR_NAMES) <= set(names)
    assert all(row.action in (IGNORE, RESET, OPERATOR) and row.meaning for row in HEALTH_POLICY)


def test_the_defaults_follow_what_each_error_means() -> None:
    policy = HealthPolicy()
    assert {xid for xid in DEFAULT_IGNORED_XIDS if policy.action(xid_name(xid)) == IGNORE} == DEFAULT_IGNORED_XIDS
    assert policy.action("XID 48") == RESET  # double-bit ECC: a reset retires the page
    assert policy.action("XID 63") == RESET  # page retirement pending
    assert policy.action("ECC") == RESET
    assert policy.action("XID 79") == OPERATOR  # fallen off the bus
    assert policy.action(NOT_PRESENT) == OPERATOR
    assert policy.action("XID 999") == RESET  # one the table does not list: a reset is the usual remedy
    assert policy.action("bit0x80") == OPERATOR  # a health bit nobody knows


def test_ix_config_moves_entries_and_the_rest_keep_their_defaults() -> None:
    text = "health:\n  reset: [79, overtemp]\n  operator: ['xid 48']\n  ignore: [ECC, 999]\n  selfHealing: false\n"
    config = config_from(parse_text(text, ORIGIN), {})
    policy = config.health_policy
    assert (policy.action("XID 79"), policy.action("OverTemp"), policy.action("XID 48")) == (RESET, RESET, OPERATOR)
    assert policy.ignores("ECC") and policy.ignores("XID 999") and policy.ignores("XID 13")
    assert policy.action("XID 63") == RESET
    assert config.self_healing == "false"
    assert config.health_reset == ("XID 79", "OverTemp")


def test_an_application_xid_can_be_made_to_count() -> None:
    config = config_from(parse_text("health:\n  operator: [13]\n", ORIGIN), {})
    chip = Chip("GPU-a", 0, "BI-V100", status=ChipStatus(xids=frozenset({13})))
    inventory = Inventory((Board("BI-V100", (chip,)),))
    assert plan(inventory, config).devices[0].reasons == ("GPU-a: XID 13",)
    assert plan(inventory, Config()).devices[0].healthy


def test_ignored_errors_leave_the_chip_in_service_in_both_front_ends() -> None:
    sick = ChipStatus(errors=frozenset({"OverTemp"}))
    inventory = Inventory((Board("BI-V100", (Chip("GPU-a", 0, "BI-V100", status=sick),)),))
    config = config_from(parse_text("health:\n  ignore: [OverTemp]\n", ORIGIN), {})
    assert plan(inventory, config).devices[0].healthy
    assert slice_content(inventory, config.health_policy).devices[0].healthy
    assert not slice_content(inventory, Config().health_policy).devices[0].healthy


def test_disable_healthchecks_keeps_its_meaning_over_the_policy() -> None:
    policy = HealthPolicy(reset=frozenset({"XID 79"}), disabled=frozenset({"xids"}))
    assert policy.ignores("XID 79") and not policy.ignores("ECC")
    assert HealthPolicy(disabled=frozenset({"all"})).ignores("ECC")
    assert ChipStatus(errors=frozenset({"ECC"}), xids=frozenset({79})).reasons(policy) == ("ECC",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("health:\n  reset: [79, EC]\n", "line 2: health.reset: unknown item 'EC' (known: XID numbers such as 48"),
        ("health:\n  ignore: all\n", "line 2: health.ignore: unknown item 'all'"),
        ("health:\n  operator: {a: 1}\n", "line 2: health.operator: expected a list of XID numbers"),
        ("health:\n  selfHealing: maybe\n", "line 2: health.selfHealing: expected auto, true or false"),
        ("health:\n  reset: [true]\n", "unknown item True"),
    ],
)
def test_a_bad_entry_is_a_named_config_error(text: str, message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse_text(text, ORIGIN)
    assert any(message in line for line in caught.value.messages), caught.value.messages


def test_a_misspelt_key_of_the_section_is_named_with_the_right_one() -> None:
    file = parse_text("health:\n  resets: [48]\n  SelfHealing: false\n", ORIGIN)
    assert any("line 2: health.resets: unknown key" in warning and "'reset'" in warning for warning in file.warnings)
    assert file.values == {"health.selfHealing": "false"}  # any letter case, as every key


def test_one_entry_in_two_lists_names_both_and_their_sources() -> None:
    file = parse_text("health:\n  reset: [48, 79]\n", ORIGIN)
    given = resolve(RUN, {}, {"IX_HEALTH_OPERATOR": "xid79"}).given
    with pytest.raises(SettingsError) as caught:
        config_from(file, given)
    assert caught.value.messages == [
        f"{ORIGIN}: line 2: health.reset: XID 79 is in health.operator too (env IX_HEALTH_OPERATOR): each XID or "
        "health error takes one action"
    ]
    given = resolve(RUN, {}, {"IX_HEALTH_OPERATOR": "xid79", "IX_HEALTH_IGNORE": "79"}).given
    with pytest.raises(SettingsError, match=r"health.operator \(env IX_HEALTH_OPERATOR\) and health.ignore \(env "
                       r"IX_HEALTH_IGNORE\) both list XID 79"):  # fmt: skip
        config_from(None, given)


def test_one_entry_in_two_lists_of_the_file_names_the_file_the_line_and_the_key() -> None:
    text = "version: v1\nhealth:\n  reset:\n    - 79\n    - ECC\n  operator: [64]\n  ignore: [13, ecc, xid79]\n"
    with pytest.raises(SettingsError) as caught:
        config_from(parse_text(text, ORIGIN), {})
    assert caught.value.messages == [
        f"{ORIGIN}: line 7: health.ignore: XID 79, ECC are in health.reset too (line 3): each XID or health error "
        "takes one action"
    ]
    manifest = ORIGIN + ": data.ix-config"  # a ConfigMap's key: lines counted in the manifest
    with pytest.raises(SettingsError, match=rf"^{manifest}: line 12: health.operator: XID 48 is in health.reset too "
                       r"\(line 11\)"):  # fmt: skip
        config_from(parse_text("health:\n  reset: [48]\n  operator: [48]\n", manifest, line_offset=9), {})


def test_both_front_ends_take_the_section() -> None:
    text = "health:\n  reset: [79]\n"
    for mode in (RUN, DRA):
        file = parse_text(text, ORIGIN, mode=mode)
        assert file.values == {"health.reset": ("XID 79",)} and not file.unused
    assert resolve(DRA, {"self_healing": "true"}, {})["self_healing"] == "true"


def test_check_config_names_a_bad_health_entry(tmp_path: Path) -> None:
    config = tmp_path / "ix-config.yaml"
    config.write_text("health:\n  reset: [48]\n  operator: [48]\n")
    result = subprocess.run(
        [sys.executable, "-m", "ix_device_plugin", "check-config", str(config)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert f"{config}: line 3: health.operator: XID 48 is in health.reset too (line 2)" in result.stderr


def test_an_xid_metric_label_is_one_of_the_tables_xids_or_other() -> None:
    listed = {row.name.removeprefix("XID ") for row in HEALTH_POLICY if is_xid(row.name)}
    labels = {xid_label(xid) for xid in range(0, 100_000)} | {xid_label(2**32 - 1)}
    assert labels == listed | {"other"} and len(labels) == 19
    assert (xid_label(48), xid_label(79), xid_label(999)) == ("48", "79", "other")
