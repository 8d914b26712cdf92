"""What the DRA driver publishes: the node's chips as the devices of its ResourceSlices (resource.k8s.io/v1).

Pure: plain data in (an Inventory, the PCIe roots the shell resolved), plain dicts out; `pool.py` cuts them
into slices and the publisher sends them.

One device per chip. Device names are `gpu-<minor>`: valid DNS labels, the names of the chips' /dev nodes,
and stable across restarts of the plugin. Attributes are unqualified (the API server reads them as
`gpu.iluvatar.com/<name>`), except the standard `resource.kubernetes.io/pcieRoot`, `pciBusID` and `numaNode`;
a string longer than the API allows (64 characters) is cut where it describes (productName) and left out where
it identifies (uuid, boardUUID), said in the log either way. A chip that is unhealthy carries the taint
`gpu.iluvatar.com/unhealthy` (NoSchedule) when the API server keeps device taints; otherwise it is left out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ix_device_plugin.core.inventory import Chip, Inventory

DRIVER = "gpu.iluvatar.com"
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
TAINT_EFFECT = "NoSchedule"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
MAX_ATTRIBUTE_LENGTH = 64  # DeviceAttributeMaxValueLength: string and version values
DESCRIPTIVE_ATTRIBUTES = ("productName",)  # cut when too long; the others identify, and are left out
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[-+._ ]?(.*))?$")


@dataclass(frozen=True)
class SliceDevice:
    """One chip as a slice device: its name, the chip, its board, and why it is unhealthy (empty: healthy)."""

    name: str
    chip: Chip
    board_uuid: str
    reasons: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        """True when nothing makes the chip unusable."""
        return not self.reasons


@dataclass(frozen=True)
class SliceContent:
    """The devices of the node's slice, plus why chips were left out of it."""

    devices: tuple[SliceDevice, ...]
    driver_version: str | None
    warnings: tuple[str, ...] = ()

    def by_name(self) -> dict[str, SliceDevice]:
        """The devices by name."""
        return {device.name: device for device in self.devices}


def device_name(chip: Chip) -> str | None:
    """The slice device name of chip, `gpu-<minor>`; None when its minor is unknown."""
    return None if chip.minor is None else f"gpu-{chip.minor}"


def semver(text: str) -> str | None:
    """text ("4.1.0", "v3.4", "4.2.0.20240101") as a semantic version ("4.2.0+20240101"); None when it has none."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch, rest = match.groups()
    core = f"{int(major)}.{int(minor or 0)}.{int(patch or 0)}"
    build = ".".join(part for part in re.split(r"[^0-9A-Za-z]+", rest or "") if part)
    return f"{core}+{build}" if build else core


def slice_content(inventory: Inventory, ignored: frozenset[str] = frozenset()) -> SliceContent:
    """The slice devices for inventory's chips, unhealthy for the reasons not ignored (IX_DISABLE_HEALTHCHECKS).

    Chips without a usable name are left out, with a warning.
    """
    devices: list[SliceDevice] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for board in inventory.boards:
        for chip in board.chips:
            name = device_name(chip)
            if name is None or not _DNS_LABEL.match(name) or name in seen:
                why = "its minor number is unknown" if name is None else f"the name {name!r} is taken or invalid"
                warnings.append(f"chip {chip.uuid!r} left out of the ResourceSlice: {why}")
                continue
            seen.add(name)
            devices.append(SliceDevice(name, chip, board.uuid, chip.status.reasons(ignored)))
    version = semver(inventory.driver_version) if inventory.driver_version else None
    if inventory.driver_version and version is None:
        warnings.append(
            f"driver version {inventory.driver_version!r} is not a version: attribute driverVersion left out"
        )
    if version is not None and len(version) > MAX_ATTRIBUTE_LENGTH:
        warnings.append(f"driver version {version!r} is longer than {MAX_ATTRIBUTE_LENGTH}: driverVersion left out")
        version = None
    for device in devices:
        for name, value in _strings(device).items():
            if len(value) > MAX_ATTRIBUTE_LENGTH:
                what = "cut" if name in DESCRIPTIVE_ATTRIBUTES else "left out"
                warnings.append(
                    f"{device.name}: attribute {name} ({value[:80]!r}) is longer than {MAX_ATTRIBUTE_LENGTH}: {what}"
                )
    return SliceContent(tuple(devices), version, tuple(warnings))


def _strings(device: SliceDevice) -> dict[str, str]:
    return {"uuid": device.chip.uuid, "productName": device.chip.product, "boardUUID": device.board_uuid}


def _string_attributes(device: SliceDevice) -> dict[str, dict[str, Any]]:
    """The string attributes of device within the API's length: descriptive ones cut, identifying ones left out."""
    attributes = {}
    for name, value in _strings(device).items():
        if len(value) <= MAX_ATTRIBUTE_LENGTH:
            attributes[name] = {"string": value}
        elif name in DESCRIPTIVE_ATTRIBUTES:
            attributes[name] = {"string": value[:MAX_ATTRIBUTE_LENGTH]}
    return attributes


def device_body(device: SliceDevice, driver_version: str | None, pcie_roots: Mapping[str, str]) -> dict[str, Any]:
    """The ResourceSlice v1 `spec.devices[]` entry for device (without taints)."""
    chip = device.chip
    attributes: dict[str, dict[str, Any]] = {**_string_attributes(device), "minor": {"int": chip.minor}}
    if chip.numa_node is not None:
        attributes["numaNode"] = {"int": chip.numa_node}
        attributes[NUMA_NODE_ATTRIBUTE] = {"int": chip.numa_node}
    if driver_version is not None:
        attributes["driverVersion"] = {"version": driver_version}
    if chip.bus_id and len(chip.bus_id) <= MAX_ATTRIBUTE_LENGTH:
        attributes[PCI_BUS_ID_ATTRIBUTE] = {"string": chip.bus_id}
    if chip.bus_id and chip.bus_id in pcie_roots:
        attributes[PCIE_ROOT_ATTRIBUTE] = {"string": pcie_roots[chip.bus_id]}
    body: dict[str, Any] = {"name": device.name, "attributes": attributes}
    if chip.memory_mib > 0:
        body["capacity"] = {"memory": {"value": f"{chip.memory_mib}Mi"}}
    return body


def unhealthy_taint(device: SliceDevice) -> dict[str, str]:
    """The device taint marking device unusable; its value says why (cut to a label value's length)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(device.reasons)).strip("-_.")[:63].rstrip("-_.")
    taint = {"key": UNHEALTHY_TAINT, "effect": TAINT_EFFECT}
    if value:
        taint["value"] = value
    return taint


def slice_devices(content: SliceContent, pcie_roots: Mapping[str, str], taints: bool) -> list[dict[str, Any]]:
    """The `spec.devices` list: unhealthy chips tainted when taints is True, left out otherwise."""
    bodies = []
    for device in content.devices:
        if not device.healthy and not taints:
            continue
        body = device_body(device, content.driver_version, pcie_roots)
        if not device.healthy:
            body["taints"] = [unhealthy_taint(device)]
        bodies.append(body)
    return bodies


def taints_dropped(sent: list[dict[str, Any]], stored: list[Mapping[str, Any]]) -> bool:
    """True when sent had device taints and the stored slices have none: the API server does not keep them."""
    if not any("taints" in device for device in sent):
        return False
    devices = [device for obj in stored for device in (obj.get("spec") or {}).get("devices") or []]
    return not any(device.get("taints") for device in devices)
