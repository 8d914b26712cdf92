"""`ix-device-plugin cdi generate`: the CDI spec for the node's chips, without the daemon."""

from __future__ import annotations

import sys
from pathlib import Path

from ix_device_plugin.deviceplugin.outputs import OutputError, cdi_generate
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.settings.options import NodeOptions
from ix_device_plugin.tools.discovery import discover_once, print_error


def cdi_generate_command(options: NodeOptions, output: str | None) -> int:
    """Print the spec, or write it to output (atomically); the exit code."""
    try:
        text = cdi_generate(discover_once(options), options.dev_root, Path(output) if output else None)
    except (BackendError, OutputError) as error:
        return print_error(options, error)
    if output:
        print(f"wrote {output}", file=sys.stderr)
    else:
        print(text, end="")
    return 0
