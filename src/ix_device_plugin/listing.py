"""`ix-device-plugin list`: the inventory and what the kubelet would be told, as data or text."""

from __future__ import annotations

from typing import Any

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.config import Config, describe
from ix_device_plugin.devnodes import with_control_nodes
from ix_device_plugin.inventory import Inventory
from ix_device_plugin.options import Options
from ix_device_plugin.plan import plan


def inventory_report(inventory: Inventory, config: Config, options: Options) -> dict[str, Any]:
    """A JSON-ready report: driver, boards and chips, effective config with sources, devices."""
    inventory = with_control_nodes(inventory, options.dev_root)
    result = plan(inventory, config)
    return {
        "driver_version": inventory.driver_version,
        "boards": [
            {
                "product": board.product,
                "chips": [
                    {
                        "uuid": chip.uuid,
                        "minor": chip.minor,
                        "bus_id": chip.bus_id,
                        "numa_node": chip.numa_node,
                        "memory_mib": chip.memory_mib,
                        "health_errors": sorted(chip.status.errors),
                        "problems": list(chip.status.reasons(frozenset())),
                        "healthy": not chip.status.reasons(config.ignored_health_errors),
                    }
                    for chip in board.chips
                ],
            }
            for board in inventory.boards
        ],
        "config": [{"key": key, "value": value, "source": source} for key, value, source in describe(config)],
        "ignored_health_errors": sorted(config.ignored_health_errors),
        "resource_name": result.resource_name,
        "capacity": result.capacity(),
        "allocatable": result.healthy_count(),
        "control_nodes": list(inventory.control_nodes),
        "devices": [
            {
                "id": device.id,
                "health": HEALTHY if device.healthy else UNHEALTHY,
                "numa_nodes": list(device.numa_nodes),
                "chips": [chip.uuid for chip in device.chips],
                "reasons": list(device.reasons),
            }
            for device in result.devices
        ],
        "warnings": list(result.warnings),
    }


def render_text(report: dict[str, Any]) -> str:
    """The report as a human reads it."""
    lines = [f"Driver version: {report['driver_version'] or 'unknown'}", "", "Boards:"]
    for index, board in enumerate(report["boards"]):
        lines.append(f"  [{index}] {board['product']}")
        for chip in board["chips"]:
            numa = "?" if chip["numa_node"] is None else chip["numa_node"]
            state = "Healthy" if chip["healthy"] else "Unhealthy: " + "; ".join(chip["problems"])
            minor = "?" if chip["minor"] is None else chip["minor"]
            lines.append(
                f"      {chip['uuid']}  minor {minor}  bus {chip['bus_id'] or '?'}  numa {numa}  "
                f"{chip['memory_mib']} MiB  {state}"
            )
    lines += ["", "Configuration:"]
    lines += [f"  {item['key']:<48} {item['value']!s:<20} ({item['source']})" for item in report["config"]]
    if report["ignored_health_errors"]:
        lines.append(f"  ignored health errors: {', '.join(report['ignored_health_errors'])}")
    lines += [
        "",
        f"Capacity:\n  {report['resource_name']}: {report['capacity']}",
        f"Allocatable:\n  {report['resource_name']}: {report['allocatable']}",
        "",
        "Devices:",
    ]
    for device in report["devices"]:
        numa = ",".join(map(str, device["numa_nodes"])) or "?"
        reasons = f"  ({'; '.join(device['reasons'])})" if device["reasons"] else ""
        lines.append(f"  {device['id']:<46} {device['health']:<9} numa {numa}{reasons}")
    lines += [f"warning: {warning}" for warning in report["warnings"]]
    return "\n".join(lines)
