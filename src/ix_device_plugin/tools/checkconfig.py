"""`ix-device-plugin check-config [--strict] PATH`: check a config file or a ConfigMap manifest before applying it."""

from __future__ import annotations

import sys

from ix_device_plugin.settings.configfile import CONFIG_KEY, read_bounded
from ix_device_plugin.settings.configmap import load_document
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import config_from
from ix_device_plugin.settings.yamlsafe import MAX_BYTES


def check_config(path: str, strict: bool = False) -> int:
    """Check a config file, a ConfigMap manifest (every data key) or `-` (stdin); print every problem.

    Exit code 0 when the plugin runs with it (what Iluvatar's plugin 4.4.0 accepts and the plugin reads with a
    warning is printed as a warning), 1 otherwise; with strict those warnings are errors.
    """
    origin = "<stdin>" if path == "-" else path
    try:
        data = sys.stdin.buffer.read(MAX_BYTES + 1) if path == "-" else read_bounded(path)
        configs = load_document(data, origin, strict)
        for config in configs.values():
            config_from(config, {})  # settings that are each valid but not together
    except SettingsError as error:
        for message in error.messages:
            print(message, file=sys.stderr)
        print(f"{origin}: invalid", file=sys.stderr)
        return 1
    warnings = [warning for config in configs.values() for warning in config.warnings]
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if warnings:
        print("(the plugin runs with these; check-config --strict refuses them)", file=sys.stderr)
    keys = "" if list(configs) == [CONFIG_KEY] and configs[CONFIG_KEY].path == origin else f" ({', '.join(configs)})"
    print(f"{origin}: valid{keys}")
    return 0
