"""`ix-device-plugin list`: the inventory and what the kubelet would be told, as data or text."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.plan import plan
from ix_device_plugin.core.telemetry import ChipSample, PodRef
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.devnodes import with_control_nodes
from ix_device_plugin.healing.story import read_story, story_line, story_path
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.options import Options, config_file_for, load_config
from ix_device_plugin.settings.resolve import describe
from ix_device_plugin.settings.table import NODE_CONFIG_LABEL
from ix_device_plugin.tools.discovery import discover_and_sample, print_error

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.settings import KubeSettings

# (ChipSample field, how the text report shows it)
_FIGURES = (
    ("temperature_c", "{:.0f} C"),
    ("gpu_utilization", "util {:.0f} %"),
    ("mem_utilization", "mem util {:.0f} %"),
    ("power_w", "{:.1f} W"),
    ("sm_clock_mhz", "sm {:.0f} MHz"),
    ("mem_clock_mhz", "mem {:.0f} MHz"),
    ("fan_speed", "fan {:.0f}"),
)


def list_command(options: Options, kube: KubeSettings | None, output: str | None) -> int:
    """Print the inventory and the devices the kubelet would be told about; the exit code."""
    path, reason = config_file_for(options, _node_label_once(options, kube))
    try:
        config, warnings = load_config(options, path)
        inventory, samples = discover_and_sample(options)
    except (SettingsError, BackendError) as error:
        return print_error(options, error)
    report = {"config_file": reason, **inventory_report(inventory, config, options)}
    add_live_figures(report, samples, _pod_allocations(options, report["resource_name"]))
    add_health_stories(report, read_story(story_path(options.plugin_dir)))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if output == "json":
        print(json.dumps(report, indent=2))
    else:
        print(f"Configuration from: {reason}\n{render_text(report)}")
    return 0


def _node_label_once(options: Options, settings: KubeSettings | None) -> str | None:
    """The node's configuration label as the API server has it now (with --per-node-config), else None."""
    if not options.per_node_config or settings is None:
        return None
    from ix_device_plugin.apiserver.client import KubeConfigError, KubeError, connect

    async def read() -> str | None:
        kube = await connect(settings)
        try:
            return (await kube.get_node(settings.node_name)).get(NODE_CONFIG_LABEL)
        finally:
            await kube.close()

    try:
        return asyncio.run(read())
    except (KubeConfigError, KubeError) as error:
        print(f"warning: cannot read node label {NODE_CONFIG_LABEL}: {error}", file=sys.stderr)
        return None


def _pod_allocations(options: Options, resource_name: str) -> tuple[dict[str, PodRef] | None, str]:
    """Device ID -> the container holding it, from the kubelet's pod-resources socket; (None, why) without."""
    from ix_device_plugin.kubelet.podresources import PodResourcesError, list_allocations

    socket_path = options.pod_resources_socket
    if socket_path is None:
        return None, "pod-resources socket turned off"
    if not socket_path.exists():
        return None, f"{socket_path} does not exist (not a Kubernetes node, or not mounted)"
    try:
        return asyncio.run(list_allocations(socket_path, {resource_name}, timeout=5.0)), str(socket_path)
    except PodResourcesError as error:
        return None, str(error)


def inventory_report(inventory: Inventory, config: Config, options: Options) -> dict[str, Any]:
    """A JSON-ready report: driver, boards and chips, effective config with sources, devices."""
    inventory = with_control_nodes(inventory, options.dev_root)
    result = plan(inventory, config)
    return {
        "driver_version": inventory.driver_version,
        "boards": [
            {
                "product": board.product,
                "board_position_known": board.membership_known,
                "chips": [
                    {
                        "uuid": chip.uuid,
                        "minor": chip.minor,
                        "bus_id": chip.bus_id,
                        "numa_node": chip.numa_node,
                        "memory_mib": chip.memory_mib,
                        "health_errors": sorted(chip.status.errors),
                        "problems": list(chip.status.reasons(frozenset())),
                        "healthy": not chip.status.reasons(config.health_policy),
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


def add_live_figures(
    report: dict[str, Any],
    samples: Mapping[str, ChipSample],
    pods: tuple[Mapping[str, PodRef] | None, str],
) -> None:
    """Add each chip's telemetry and, where the kubelet said, the container holding each device."""
    for board in report["boards"]:
        for chip in board["chips"]:
            sample = samples.get(chip["uuid"])
            figures = {} if sample is None else asdict(sample)
            chip["telemetry"] = {name: value for name, value in figures.items() if value is not None}
    allocations, source = pods
    report["pod_resources"] = source
    report["pod_resources_read"] = allocations is not None
    for device in report["devices"]:
        holder = None if allocations is None else allocations.get(device["id"])
        device["held_by"] = None if holder is None else asdict(holder)


def add_health_stories(report: dict[str, Any], story: Mapping[str, Any] | None) -> None:
    """Add each chip's health story as the running agent last wrote it (None: no agent has written one)."""
    report["self_healing"] = None if story is None else story.get("self_healing")
    report["story_written"] = None if story is None else story.get("written")
    by_uuid = {} if story is None else {chip.get("uuid"): chip for chip in story["chips"] if isinstance(chip, dict)}
    for board in report["boards"]:
        for chip in board["chips"]:
            chip["health_story"] = by_uuid.get(chip["uuid"])


def _figures_line(telemetry: Mapping[str, float]) -> str:
    shown = [form.format(telemetry[name]) for name, form in _FIGURES if name in telemetry]
    if "mem_used_mib" in telemetry and "mem_total_mib" in telemetry:
        shown.insert(2, f"{telemetry['mem_used_mib']:.0f}/{telemetry['mem_total_mib']:.0f} MiB used")
    return "  ".join(shown)


def _holder(device: Mapping[str, Any], pods_read: bool) -> str:
    holder = device.get("held_by")
    if holder is not None:
        return f"  held by {holder['namespace']}/{holder['pod']} ({holder['container']})"
    return "  free" if pods_read else ""


def _setting(value: Any) -> str:
    """A setting's value as it is written in the config file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def _healing_line(report: Mapping[str, Any]) -> str:
    if "self_healing" not in report:
        return ""
    if report["self_healing"] is None:
        return "Self-healing: no health story (the agent is not running on this node, or has not written one yet)"
    written = report.get("story_written")
    when = time.strftime(" (as of %Y-%m-%d %H:%M:%S)", time.localtime(written)) if isinstance(written, float) else ""
    return f"Self-healing: {report['self_healing']}{when}"


def render_text(report: dict[str, Any]) -> str:
    """The report as a human reads it."""
    lines = [f"Driver version: {report['driver_version'] or 'unknown'}"]
    lines += [healing] if (healing := _healing_line(report)) else []
    lines += ["", "Boards:"]
    for index, board in enumerate(report["boards"]):
        unplaced = "" if board["board_position_known"] else "  (board position unknown: a board of its own)"
        lines.append(f"  [{index}] {board['product']}{unplaced}")
        for chip in board["chips"]:
            numa = "?" if chip["numa_node"] is None else chip["numa_node"]
            state = "Healthy" if chip["healthy"] else "Unhealthy: " + "; ".join(chip["problems"])
            minor = "?" if chip["minor"] is None else chip["minor"]
            lines.append(
                f"      {chip['uuid']}  minor {minor}  bus {chip['bus_id'] or '?'}  numa {numa}  "
                f"{chip['memory_mib']} MiB  {state}"
            )
            if chip.get("health_story"):
                lines.append(f"          health story: {story_line(chip['health_story'])}")
            if chip.get("telemetry"):
                lines.append(f"          {_figures_line(chip['telemetry'])}")
    lines += ["", "Configuration:"]
    lines += [f"  {item['key']:<48} {_setting(item['value']):<20} ({item['source']})" for item in report["config"]]
    if report["ignored_health_errors"]:
        lines.append(f"  ignored health errors: {', '.join(report['ignored_health_errors'])}")
    lines += [
        "",
        f"Capacity:\n  {report['resource_name']}: {report['capacity']}",
        f"Allocatable:\n  {report['resource_name']}: {report['allocatable']}",
        "",
        "Devices:",
    ]
    pods_read = bool(report.get("pod_resources_read"))
    for device in report["devices"]:
        numa = ",".join(map(str, device["numa_nodes"])) or "?"
        reasons = f"  ({'; '.join(device['reasons'])})" if device["reasons"] else ""
        held = _holder(device, pods_read)
        lines.append(f"  {device['id']:<46} {device['health']:<9} numa {numa}{reasons}{held}")
    if "pod_resources" in report and not pods_read:
        lines.append(f"(which pod holds each device is not known: {report['pod_resources']})")
    lines += [f"warning: {warning}" for warning in report["warnings"]]
    return "\n".join(lines)
