"""`ix-device-plugin list --dra`: the devices of the node's ResourceSlices and the claims that hold them."""

from __future__ import annotations

import json
import sys
from typing import Any

from ix_device_plugin.dra.checkpoint import CHECKPOINT_FILE, CheckpointError, read_checkpoint
from ix_device_plugin.dra.pool import slice_base_name
from ix_device_plugin.dra.prepared import PreparedClaim, PreparedDevice
from ix_device_plugin.dra.registration import plugin_dir
from ix_device_plugin.dra.slices import SlicePolicy, counter_set_body, slice_content, slice_devices
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.pcie import pcie_roots
from ix_device_plugin.healing.story import read_story, story_line, story_path
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.options import DraOptions, load_config
from ix_device_plugin.tools.discovery import discover_once, print_error


def dra_list_command(options: DraOptions, output: str | None) -> int:
    """Print the devices the node's ResourceSlices would hold and which prepared claim holds each."""
    try:
        config, _ = load_config(options.base)
        inventory = discover_once(options.base)
        checkpoint = read_checkpoint(plugin_dir(options.plugins_dir) / CHECKPOINT_FILE)
    except CheckpointError as error:
        print_error(options.base, error)
        print("hint: the DRA driver rebuilds it from the claims' CDI specs at its next start", file=sys.stderr)
        return 1
    except (BackendError, SettingsError) as error:
        return print_error(options.base, error)
    claims = dict(checkpoint.claims) if checkpoint else {}
    policy = SlicePolicy(config.splitboard, config.replicas)
    content = slice_content(inventory, config.health_policy, policy)
    report = {
        "resourceSlice": slice_base_name(options.node_name),
        "devices": slice_devices(content, pcie_roots(inventory, options.base.sysfs_root), taints=True),
        "sharedCounters": [counter_set_body(counter_set) for counter_set in content.counter_sets],
        "warnings": list(content.warnings),
        "preparedClaims": {uid: _claim_report(claim) for uid, claim in claims.items()},
        "healthStory": read_story(story_path(plugin_dir(options.plugins_dir))),
    }
    if output == "json":
        print(json.dumps(report, indent=2))
        return 0
    shared = f", {policy.replicas} shares per device" if policy.shared else ""
    print(f"ResourceSlice {report['resourceSlice']} (driver gpu.iluvatar.com, pool {options.node_name}{shared}):")
    held = _holders(claims, {d.chip.uuid: d.name for d in content.devices if d.kind == "chip"})
    story = report["healthStory"]
    stories = {} if story is None else {chip.get("uuid"): chip for chip in story["chips"] if isinstance(chip, dict)}
    healing = story["self_healing"] if story else "no health story (no driver wrote one)"
    print(f"  self-healing: {healing}")
    for device in report["devices"]:
        print(f"  {_device_line(device)}{held.get(device['name'], '')}")
        chip = stories.get(device["attributes"].get("uuid", {}).get("string"))
        if chip is not None:
            print(f"      health story: {story_line(chip)}")
    for warning in content.warnings:
        print(f"  warning: {warning}")
    print(f"Prepared claims ({len(claims)}):")
    for uid, claim in sorted(claims.items()):
        devices = ", ".join(_held(device) for device in claim.devices)
        pending = " (GPU reset pending)" if claim.reset_pending else ""
        print(f"  {_name(claim)} ({uid}): {devices}{pending}")
    return 0


def _claim_report(claim: PreparedClaim) -> dict[str, Any]:
    """The claim, its device names, and how it holds each (`held`: type, chips, share, config)."""
    report: dict[str, Any] = {
        "claim": _name(claim),
        "devices": [device.device for device in claim.devices],
        "held": [],
    }
    if claim.reset_pending:
        report["resetPending"] = True
    for device in claim.devices:
        entry: dict[str, Any] = {"device": device.device, "type": device.kind, "chips": list(device.chip_uuids)}
        if device.share_id:
            entry.update(shareID=device.share_id, shares=device.shares, slots=list(device.slots))
        if device.admin:
            entry["adminAccess"] = True
        if device.config.describe():
            entry["config"] = device.config.describe()
        report["held"].append(entry)
    return report


def _name(claim: PreparedClaim) -> str:
    """namespace/name, or `unnamed` for a claim rebuilt from its CDI spec (not prepared again since)."""
    return f"{claim.ref.namespace}/{claim.ref.name}" if claim.ref.name else "unnamed"


def _device_line(device: dict[str, Any]) -> str:
    attributes = device["attributes"]
    kind = attributes.get("type", {}).get("string", "chip")
    identity = attributes.get("uuid" if kind == "chip" else "boardUUID", {}).get("string", "?")
    line = f"{device['name']}: {kind} {identity}"
    if kind == "chip":
        line += f" board {attributes.get('boardUUID', {}).get('string', '?')}"
    if device.get("allowMultipleAllocations"):
        line += f", {device['capacity']['shares']['value']} shares"
    return line + (" UNHEALTHY (tainted)" if device.get("taints") else "")


def _held(device: PreparedDevice) -> str:
    text = device.device
    if device.share_id:
        text += f" (share {device.share_id}, {device.shares} of its shares, slots {','.join(map(str, device.slots))})"
    if device.admin:
        text += " (admin access)"
    if device.config.describe():
        text += f" [{device.config.describe()}]"
    return text


def _holders(claims: dict[str, PreparedClaim], chip_names: dict[str, str]) -> dict[str, str]:
    """For each device name, the claims that hold it: `; held by ns/name`, `; shares held by ns/a (1), ns/b (2)`."""
    whole: dict[str, list[str]] = {}
    shares: dict[str, list[str]] = {}
    for claim in claims.values():
        for device in claim.devices:
            who = _name(claim)
            if device.share_id:
                shares.setdefault(device.device, []).append(f"{who} ({device.shares})")
            elif not device.admin:
                whole.setdefault(device.device, []).append(who)
                for uuid in device.chips:  # a board holds its chips
                    if uuid in chip_names:
                        whole.setdefault(chip_names[uuid], []).append(f"{who} (as {device.device})")
    lines = {name: f"; held by {', '.join(owners)}" for name, owners in whole.items()}
    for name, owners in shares.items():
        lines[name] = lines.get(name, "") + f"; shares held by {', '.join(owners)}"
    return lines
