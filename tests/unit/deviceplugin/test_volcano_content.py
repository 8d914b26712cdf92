"""What ix-device-info-cm-<node> says, read back and compared: Iluvatar's layout exactly, UpdateTime always newer."""

from __future__ import annotations

import json

from ix_device_plugin.core.plan import plan
from ix_device_plugin.deviceplugin.features.volcano import (
    DEVICE_INFO_KEY,
    DEVICE_LIST_KEY,
    config_map_data,
    stored_content,
    update_time,
    wanted_content,
)
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.settings.config import Config


def test_the_data_is_upstreams_json_with_update_time_last():
    content = {DEVICE_LIST_KEY: {"DeviceList": ["GPU-a", "GPU-b"]}, DEVICE_INFO_KEY: {"DeviceInfo": {}}}
    data = config_map_data(content, [DEVICE_LIST_KEY], 1700000000)
    assert data == {DEVICE_LIST_KEY: '{"DeviceList": ["GPU-a", "GPU-b"], "UpdateTime": 1700000000}'}


def test_what_was_written_reads_back_as_the_same_content_and_its_time():
    wanted = wanted_content(plan(SimulatedBackend("BI-V100:2").discover(), Config()), [])
    data = config_map_data(wanted, wanted, 1700000123)
    assert stored_content(data) == (wanted, 1700000123)
    assert json.loads(data[DEVICE_INFO_KEY])["UpdateTime"] == 1700000123


def test_a_missing_or_unreadable_key_differs_from_any_content():
    content, latest = stored_content({DEVICE_LIST_KEY: "not json", DEVICE_INFO_KEY: '["a list"]'})
    assert content == {DEVICE_LIST_KEY: None, DEVICE_INFO_KEY: None} and latest == 0
    assert stored_content({}) == ({DEVICE_INFO_KEY: None, DEVICE_LIST_KEY: None}, 0)


def test_a_hostile_edit_reads_as_unreadable_and_is_written_again():
    nested = "[" * 100_000 + "]" * 100_000
    content, latest = stored_content(
        {DEVICE_LIST_KEY: nested, DEVICE_INFO_KEY: '{"UpdateTime": 1, "x": ' + nested + "}"}
    )
    assert content == {DEVICE_LIST_KEY: None, DEVICE_INFO_KEY: None} and latest == 0


def test_update_time_is_now_but_always_later_than_before():
    assert update_time(1700000050.9) == 1700000050
    assert update_time(1700000050.9, 1700000050) == 1700000051  # two writes in one second
    assert update_time(1700000050.9, 1700000040, 1700000099) == 1700000100  # a clock set back: still newer
