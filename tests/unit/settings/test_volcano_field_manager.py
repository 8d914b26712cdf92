"""--volcano-field-manager / IX_VOLCANO_FIELD_MANAGER: whose Volcano annotations the device plugin believes."""

from __future__ import annotations

import pytest

from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.options import options_from
from ix_device_plugin.settings.resolve import resolve
from ix_device_plugin.settings.table import DRA, RUN


def test_the_default_is_volcanos_scheduler_and_a_flag_beats_the_variable() -> None:
    assert options_from(resolve(RUN, {}, {})).volcano_field_manager == "vc-scheduler"
    env = {"IX_VOLCANO_FIELD_MANAGER": "from-env"}
    assert options_from(resolve(RUN, {}, env)).volcano_field_manager == "from-env"
    assert options_from(resolve(RUN, {"volcano_field_manager": "from-flag"}, env)).volcano_field_manager == "from-flag"


@pytest.mark.parametrize("value", ["tab\there", "x" * 129, "nul\0", "del\x7f"])
def test_a_name_the_api_server_would_not_take_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        resolve(RUN, {}, {"IX_VOLCANO_FIELD_MANAGER": value})
    (message,) = caught.value.messages
    assert message.startswith("environment variable IX_VOLCANO_FIELD_MANAGER: expected a field manager's name")


def test_the_dra_driver_does_not_take_it() -> None:
    assert resolve(DRA, {}, {"IX_VOLCANO_FIELD_MANAGER": "x"}).unused_env == ("IX_VOLCANO_FIELD_MANAGER",)
