"""`ix-device-plugin list --dra`: the devices of the node's ResourceSlice and the prepared claims."""

from __future__ import annotations

import json

from ix_device_plugin.dra.checkpoint import CHECKPOINT_FILE, CheckpointError, read_checkpoint
from ix_device_plugin.dra.pool import slice_base_name
from ix_device_plugin.dra.registration import plugin_dir
from ix_device_plugin.dra.slices import slice_content, slice_devices
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.pcie import pcie_roots
from ix_device_plugin.settings.options import DraOptions
from ix_device_plugin.tools.discovery import discover_once, print_error


def dra_list_command(options: DraOptions, output: str | None) -> int:
    """Print the devices the node's ResourceSlice would hold and the prepared claims of the checkpoint."""
    try:
        inventory = discover_once(options.base)
        checkpoint = read_checkpoint(plugin_dir(options.plugins_dir) / CHECKPOINT_FILE)
    except (BackendError, CheckpointError) as error:
        return print_error(options.base, error)
    claims = dict(checkpoint.claims) if checkpoint else {}
    content = slice_content(inventory, options.config.ignored_health_errors)
    report = {
        "resourceSlice": slice_base_name(options.node_name),
        "devices": slice_devices(content, pcie_roots(inventory, options.base.sysfs_root), taints=True),
        "warnings": list(content.warnings),
        "preparedClaims": {
            uid: {"claim": f"{c.ref.namespace}/{c.ref.name}", "devices": [d.device for d in c.devices]}
            for uid, c in claims.items()
        },
    }
    if output == "json":
        print(json.dumps(report, indent=2))
        return 0
    print(f"ResourceSlice {report['resourceSlice']} (driver gpu.iluvatar.com, pool {options.node_name}):")
    for device in report["devices"]:
        attributes = device["attributes"]
        taint = " UNHEALTHY (tainted)" if device.get("taints") else ""
        uuid = attributes.get("uuid", {}).get("string", "?")
        board = attributes.get("boardUUID", {}).get("string", "?")
        print(f"  {device['name']}: {uuid} board {board}{taint}")
    for warning in content.warnings:
        print(f"  warning: {warning}")
    print(f"Prepared claims ({len(claims)}):")
    for uid, claim in sorted(claims.items()):
        print(f"  {claim.ref.namespace}/{claim.ref.name} ({uid}): {', '.join(d.device for d in claim.devices)}")
    return 0
