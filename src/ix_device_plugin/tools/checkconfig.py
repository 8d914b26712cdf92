"""`ix-device-plugin check-config PATH`: check a config file or a ConfigMap manifest before applying it."""

from __future__ import annotations

import sys

from ix_device_plugin.settings.configfile import CONFIG_KEY, load_document, read_bounded
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import config_from
from ix_device_plugin.settings.yamlsafe import MAX_BYTES


def check_config(path: str) -> int:
    """Check a config file, a ConfigMap manifest (every data key) or `-` (stdin); print every problem.
    Exit code 0 when valid, 1 otherwise."""
    origin = "<stdin>" if path == "-" else path
    try:
        data = sys.stdin.buffer.read(MAX_BYTES + 1) if path == "-" else read_bounded(path)
        configs = load_document(data, origin)
        for config in configs.values():
            config_from(config, {})  # settings that are each valid but not together
    except SettingsError as error:
        for message in error.messages:
            print(message, file=sys.stderr)
        print(f"{origin}: invalid", file=sys.stderr)
        return 1
    for config in configs.values():
        for warning in config.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    keys = "" if list(configs) == [CONFIG_KEY] and configs[CONFIG_KEY].path == origin else f" ({', '.join(configs)})"
    print(f"{origin}: valid{keys}")
    return 0
