"""One discovery outside the daemons, for the commands that print what is on the node."""

from __future__ import annotations

import sys

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.telemetry import ChipSample
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.devnodes import with_control_nodes
from ix_device_plugin.hardware.open import backend_factory
from ix_device_plugin.settings.options import NodeOptions


def discover_once(options: NodeOptions) -> Inventory:
    """The node's inventory, with its control nodes, from one discovery; raises BackendError."""
    backend = backend_factory(options)()
    try:
        return with_control_nodes(backend.discover(), options.dev_root)
    finally:
        backend.close()


def discover_and_sample(options: NodeOptions) -> tuple[Inventory, dict[str, ChipSample]]:
    """One discovery and one telemetry pass in the same library session; raises BackendError."""
    backend = backend_factory(options)()
    try:
        inventory = with_control_nodes(backend.discover(), options.dev_root)
        return inventory, dict(backend.sample(inventory))
    finally:
        backend.close()


def print_error(options: NodeOptions, error: Exception) -> int:
    """Print error for the operator (with a hint when no GPU library answers); exit code 1."""
    print(f"error: {error}", file=sys.stderr)
    if isinstance(error, BackendError) and options.backend == "ixml":
        print("hint: on a machine without Iluvatar GPUs, try --backend simulated", file=sys.stderr)
    return 1
