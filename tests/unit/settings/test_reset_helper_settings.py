"""The reset helper's settings: exactly what it needs (no API access, no config file), its socket's per-mode default,
and the rate limit's bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from ix_device_plugin.resethelper.command import helper_options_from
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import resolve
from ix_device_plugin.settings.table import DRA, RESET_HELPER, RUN, settings_of


def test_the_helper_takes_only_what_a_reset_needs() -> None:
    assert {s.name for s in settings_of(RESET_HELPER)} == {
        "backend", "simulated_devices", "ixml_library", "dev_root", "sysfs_root", "ixsmi_path", "reset_timeout",
        "reset_helper_socket", "max_resets_per_minute", "log_level", "log_format",
    }  # fmt: skip


def test_the_socket_has_a_default_for_the_helper_and_none_for_the_agent() -> None:
    assert resolve(RESET_HELPER, {}, {})["reset_helper_socket"] == Path("/run/ix-reset/reset.sock")
    for mode in (RUN, DRA):
        assert resolve(mode, {}, {})["reset_helper_socket"] is None
    given = resolve(RUN, {}, {"IX_RESET_HELPER_SOCKET": "/run/x/r.sock"})
    assert (given["reset_helper_socket"], given.sources["reset_helper_socket"]) == (
        Path("/run/x/r.sock"),
        "env IX_RESET_HELPER_SOCKET",
    )


def test_the_helper_options_come_from_flags_over_variables() -> None:
    env = {"IX_BACKEND": "simulated", "IX_RESET_HELPER_MAX_PER_MINUTE": "3", "IX_RESET_TIMEOUT": "7"}
    options = helper_options_from(resolve(RESET_HELPER, {"reset_helper_socket": "/s/r.sock"}, env))
    assert (options.socket_path, options.max_resets_per_minute) == (Path("/s/r.sock"), 3)
    assert (options.node.backend, options.node.reset_timeout) == ("simulated", 7.0)


@pytest.mark.parametrize("given", ["0", "601", "-1", "2.5", "twelve", "1" * 20])
def test_a_rate_limit_out_of_bounds_is_refused_naming_the_variable(given: str) -> None:
    with pytest.raises(SettingsError) as refused:
        resolve(RESET_HELPER, {}, {"IX_RESET_HELPER_MAX_PER_MINUTE": given})
    assert refused.value.messages == [
        f"environment variable IX_RESET_HELPER_MAX_PER_MINUTE: expected a whole number from 1 to 600, got {given!r}"
    ]


def test_an_agent_variable_the_helper_does_not_use_is_noted_not_parsed() -> None:
    resolved = resolve(RESET_HELPER, {}, {"IX_REPLICAS": "bad", "IX_HEALTH_INTERVAL": "2"})
    assert resolved.unused_env == ("IX_HEALTH_INTERVAL", "IX_REPLICAS")
