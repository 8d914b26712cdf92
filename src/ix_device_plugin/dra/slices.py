"""What the DRA driver publishes: the node's chips and boards as the devices of its ResourceSlices (resource.k8s.io/v1).

Pure: plain data in (an Inventory, the PCIe roots the shell resolved, the node's policy), plain dicts out;
`pool.py` cuts them into slices and the publisher sends them.

Every chip is a device named `gpu-<minor>` (a DNS label, the name of its /dev node, stable across restarts).
A board of several chips (BI-V150) is also a device of its own, `board-<lowest minor>`: the board and its
chips draw on the board's counter set (one counter per chip, of 2 units: the board takes both, a chip one), so
that the scheduler never hands out a board and one of its chips at once, while a monitoring claim (adminAccess)
can still take a chip a workload holds. A single-chip board is its chip. Every device also consumes the counter
`chips` of its board's set (every board has one, single-chip boards included): a chip 1, a board its chip count,
so that one quota pool (Kueue's counter source `chips`) charges chips and boards alike; the set holds twice the
board's chips, so that this counter never limits what the per-chip counters allow. The attribute `type` (`chip`
or `board`) tells them apart, `wholeBoard` is true for whatever gives a whole board, and `extendedResource` for what one
`iluvatar.com/gpu` is on this node (chips with flags.splitboard, whole boards without).

With time-slicing replicas N (sharing.timeSlicing.replicas >= 2) the node publishes what the device plugin
would advertise, chips with flags.splitboard and whole boards without, each allowing multiple allocations
with a consumable capacity `shares` of N (a claim takes one unless it asks for more), and no counters. The
attribute `shared` says which devices are shared (the DeviceClass share.gpu.iluvatar.com selects them).

Attributes are unqualified (the API server reads them as `gpu.iluvatar.com/<name>`), except the standard
`resource.kubernetes.io/pcieRoot`, `pciBusID` and `numaNode`; a string longer than the API allows (64
characters) is cut where it describes (productName) and left out where it identifies (uuid, boardUUID).
An unhealthy device carries the taint `gpu.iluvatar.com/unhealthy` (NoSchedule) where the API server keeps
device taints; otherwise it is left out. What self-healing does about it is the taint `gpu.iluvatar.com/healing`
beside it while it is being reset or waits for an operator: its value resetting, needs-operator, reset-unavailable
or reset-limit-reached.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ix_device_plugin.core import products
from ix_device_plugin.core.inventory import Board, Chip, Ignored, Inventory
from ix_device_plugin.core.plan import shortfall

DRIVER = "gpu.iluvatar.com"
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
# What self-healing does about an unhealthy device (resetting, needs-operator, reset-unavailable, ...): NoSchedule
# like the other (the device is out already), which every API server that keeps device taints takes.
HEALING_TAINT = f"{DRIVER}/healing"
TAINT_EFFECT = "NoSchedule"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
MAX_ATTRIBUTE_LENGTH = 64  # DeviceAttributeMaxValueLength: string and version values
DESCRIPTIVE_ATTRIBUTES = ("productName",)  # cut when too long; the others identify, and are left out
CHIP, BOARD = "chip", "board"
SHARES = "shares"  # the consumable capacity of a shared device
CHIPS_COUNTER = "chips"  # the counter every device consumes, one per chip: the quota unit of chips and boards
# A chip's counter holds 2 units: a board takes both units of each of its chips' counters, a chip one of its own.
# So a board never goes with one of its chips, and yet a chip can go to a workload and to a monitoring claim
# (adminAccess) at once: the scheduler checks counters for admin access too.
CHIP_UNITS, BOARD_UNITS = 1, 2
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[-+._ ]?(.*))?$")


@dataclass(frozen=True)
class SlicePolicy:
    """What the node's ix-config says about its devices: splitboard, and time-slicing replicas."""

    splitboard: bool = False
    replicas: int = 0

    @property
    def shared(self) -> bool:
        """True when each published device is shared by up to `replicas` allocations."""
        return self.replicas >= 2


@dataclass(frozen=True)
class SliceDevice:
    """One device of the slice: a chip, or a whole board (its chips, in minor order).

    reasons: why it is unhealthy (empty: healthy); counter_set: the board counter set it draws on ("" none);
    chip_counters: it draws on its chips' own counters there too (a board device stands beside its chips);
    shares: how many allocations may share it (0: one, exclusively); extended: it is what one
    `iluvatar.com/gpu` is on this node.
    """

    name: str
    chips: tuple[Chip, ...]
    board_uuid: str
    product: str
    reasons: tuple[str, ...] = ()
    kind: str = CHIP
    whole_board: bool = True
    extended: bool = True
    counter_set: str = ""
    chip_counters: bool = False
    shares: int = 0

    @property
    def healing(self) -> str:
        """What self-healing does about the device's chip (a board: its first chip that has a word); "" none."""
        return next((chip.status.care for chip in self.chips if chip.status.care), "")

    @property
    def chip(self) -> Chip:
        """The device's (first) chip."""
        return self.chips[0]

    @property
    def uuid(self) -> str:
        """The device's identity: the chip's UUID, or the board's."""
        return self.board_uuid if self.kind == BOARD else self.chip.uuid

    @property
    def healthy(self) -> bool:
        """True when nothing makes the device unusable."""
        return not self.reasons


@dataclass(frozen=True)
class CounterSet:
    """A board's shared counters: `chips` (chips x BOARD_UNITS), and with a board device beside its chips one per
    chip (named as the chip's device), each of BOARD_UNITS."""

    name: str
    counters: tuple[str, ...]
    chips: int = 0


@dataclass(frozen=True)
class SliceContent:
    """The devices of the node's slices, the boards' counter sets, and why anything was left out."""

    devices: tuple[SliceDevice, ...]
    driver_version: str | None
    warnings: tuple[str, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()
    policy: SlicePolicy = field(default_factory=SlicePolicy)

    def by_name(self) -> dict[str, SliceDevice]:
        """The devices by name."""
        return {device.name: device for device in self.devices}


def device_name(chip: Chip) -> str | None:
    """The slice device name of chip, `gpu-<minor>`; None when its minor is unknown."""
    return None if chip.minor is None else f"gpu-{chip.minor}"


def board_device_name(chip_names: list[str]) -> str:
    """The name of the board device whose chips have these device names: `board-<lowest minor>`."""
    return "board-" + str(min(int(name.removeprefix("gpu-")) for name in chip_names))


def semver(text: str) -> str | None:
    """text ("4.1.0", "v3.4", "4.2.0.20240101") as a semantic version ("4.2.0+20240101"); None when it has none."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch, rest = match.groups()
    core = f"{int(major)}.{int(minor or 0)}.{int(patch or 0)}"
    build = ".".join(part for part in re.split(r"[^0-9A-Za-z]+", rest or "") if part)
    return f"{core}+{build}" if build else core


def slice_content(
    inventory: Inventory, ignored: Ignored = frozenset(), policy: SlicePolicy = SlicePolicy()
) -> SliceContent:
    """The slice devices for inventory under policy, unhealthy for the reasons not ignored (the health policy).

    Chips without a usable name are left out, with a warning, and so is the board device of their board.
    """
    warnings: list[str] = []
    seen: set[str] = set()
    chips: list[SliceDevice] = []
    boards: list[SliceDevice] = []
    sets: list[CounterSet] = []
    for board in inventory.boards:
        named: list[tuple[str, Chip]] = []
        for chip in board.chips:
            name = device_name(chip)
            if name is None or not _DNS_LABEL.match(name) or name in seen:
                why = "its minor number is unknown" if name is None else f"the name {name!r} is taken or invalid"
                warnings.append(f"chip {chip.uuid!r} left out of the ResourceSlice: {why}")
                continue
            seen.add(name)
            named.append((name, chip))
        if not named:
            continue
        board_chips, board_device, counter_set, warning = _board_devices(board, named, ignored, policy)
        chips += board_chips
        boards += [board_device] if board_device is not None else []
        sets += [counter_set] if counter_set is not None else []
        warnings += [warning] if warning else []
    version = semver(inventory.driver_version) if inventory.driver_version else None
    if inventory.driver_version and version is None:
        warnings.append(
            f"driver version {inventory.driver_version!r} is not a version: attribute driverVersion left out"
        )
    if version is not None and len(version) > MAX_ATTRIBUTE_LENGTH:
        warnings.append(f"driver version {version!r} is longer than {MAX_ATTRIBUTE_LENGTH}: driverVersion left out")
        version = None
    devices = (*chips, *boards)
    for device in devices:
        for name, value in _strings(device).items():
            if len(value) > MAX_ATTRIBUTE_LENGTH:
                what = "cut" if name in DESCRIPTIVE_ATTRIBUTES else "left out"
                warnings.append(
                    f"{device.name}: attribute {name} ({value[:80]!r}) is longer than {MAX_ATTRIBUTE_LENGTH}: {what}"
                )
    return SliceContent(devices, version, tuple(warnings), tuple(sets), policy)


def _board_devices(
    board: Board, named: list[tuple[str, Chip]], ignored: Ignored, policy: SlicePolicy
) -> tuple[list[SliceDevice], SliceDevice | None, CounterSet | None, str]:
    """board's devices as policy says: its chips, its board device and counter set (a multi-chip board), and why
    the board device is left out ("" when it is not)."""
    product = products.model(named[0][1].product or board.product)
    multi = products.expected_chips(board) > 1
    shares = policy.replicas if policy.shared else 0
    board_name = board_device_name([name for name, _ in named])
    incomplete = multi and len(named) < len(board.chips)
    warning = f"{board_name} left out of the ResourceSlice: a chip of board {board.uuid!r} has no device"
    publish_board = multi and not incomplete and not (policy.shared and policy.splitboard)
    publish_chips = not (multi and policy.shared and not policy.splitboard)
    counters = not policy.shared
    chip_counters = multi and publish_board and publish_chips
    chips = [
        SliceDevice(
            name,
            (chip,),
            board.uuid,
            products.model(chip.product or board.product),
            chip.status.reasons(ignored),
            CHIP,
            whole_board=not multi,
            extended=policy.splitboard or not multi,
            counter_set=board_name if counters else "",
            chip_counters=chip_counters,
            shares=shares,
        )
        for name, chip in named
        if publish_chips
    ]
    counter_set = None
    if counters:
        counter_set = CounterSet(board_name, tuple(name for name, _ in named) if chip_counters else (), len(named))
    if not publish_board:
        return chips, None, counter_set, warning if incomplete else ""
    reasons = tuple(f"{name}: {reason}" for name, chip in named for reason in chip.status.reasons(ignored))
    reasons += shortfall(board, product)
    device = SliceDevice(
        board_name,
        tuple(chip for _, chip in named),
        board.uuid,
        product,
        reasons,
        BOARD,
        whole_board=True,
        extended=not policy.splitboard,
        counter_set=board_name if counters else "",
        chip_counters=chip_counters,
        shares=shares,
    )
    return chips, device, counter_set, ""


def _strings(device: SliceDevice) -> dict[str, str]:
    strings = {"productName": device.product, "boardUUID": device.board_uuid}
    return strings if device.kind == BOARD else {"uuid": device.chip.uuid, **strings}


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
    attributes: dict[str, dict[str, Any]] = _string_attributes(device)
    attributes.update(
        type={"string": device.kind},
        wholeBoard={"bool": device.whole_board},
        extendedResource={"bool": device.extended},
        shared={"bool": device.shares >= 2},
    )
    numa = {chip.numa_node for chip in device.chips}
    roots = {pcie_roots.get(chip.bus_id) if chip.bus_id else None for chip in device.chips}
    if device.kind == CHIP:
        attributes["minor"] = {"int": device.chip.minor}
        bus_id = device.chip.bus_id
        if bus_id and len(bus_id) <= MAX_ATTRIBUTE_LENGTH:
            attributes[PCI_BUS_ID_ATTRIBUTE] = {"string": bus_id}
    if len(numa) == 1 and None not in numa:
        attributes["numaNode"] = {"int": next(iter(numa))}
        attributes[NUMA_NODE_ATTRIBUTE] = {"int": next(iter(numa))}
    if driver_version is not None:
        attributes["driverVersion"] = {"version": driver_version}
    if len(roots) == 1 and None not in roots:
        attributes[PCIE_ROOT_ATTRIBUTE] = {"string": next(iter(roots))}
    body: dict[str, Any] = {"name": device.name, "attributes": attributes}
    memory = sum(chip.memory_mib for chip in device.chips)
    capacity: dict[str, Any] = {}
    if memory > 0 and all(chip.memory_mib > 0 for chip in device.chips):
        capacity["memory"] = {"value": f"{memory}Mi"}
    if device.shares >= 2:
        body["allowMultipleAllocations"] = True
        if "memory" in capacity:  # consumable once shared: a claim takes none unless it asks
            capacity["memory"]["requestPolicy"] = {"default": "0", "validRange": {"min": "0"}}
        capacity[SHARES] = {
            "value": str(device.shares),
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": str(device.shares), "step": "1"}},
        }
    if capacity:
        body["capacity"] = capacity
    if device.counter_set:
        body["consumesCounters"] = [{"counterSet": device.counter_set, "counters": _consumed(device)}]
    return body


def _consumed(device: SliceDevice) -> dict[str, dict[str, str]]:
    """The counters device consumes from its board's set: its chips' own (with a board device beside them), and
    `chips`, one per chip."""
    counters = {}
    if device.chip_counters:
        names, units = ([device.name], CHIP_UNITS) if device.kind == CHIP else (_chip_names(device), BOARD_UNITS)
        counters = {name: {"value": str(units)} for name in names}
    counters[CHIPS_COUNTER] = {"value": str(len(device.chips))}
    return counters


def _chip_names(device: SliceDevice) -> list[str]:
    return [name for chip in device.chips if (name := device_name(chip)) is not None]


def counter_set_body(counter_set: CounterSet) -> dict[str, Any]:
    """The ResourceSlice v1 `spec.sharedCounters[]` entry for a board's counter set."""
    counters = {name: {"value": str(BOARD_UNITS)} for name in counter_set.counters}
    counters[CHIPS_COUNTER] = {"value": str(BOARD_UNITS * counter_set.chips)}
    return {"name": counter_set.name, "counters": counters}


def unhealthy_taint(device: SliceDevice) -> dict[str, str]:
    """The device taint marking device unusable; its value says why (cut to a label value's length)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(device.reasons)).strip("-_.")[:63].rstrip("-_.")
    taint = {"key": UNHEALTHY_TAINT, "effect": TAINT_EFFECT}
    if value:
        taint["value"] = value
    return taint


def slice_devices(
    content: SliceContent, pcie_roots: Mapping[str, str], taints: bool, counters: bool = True, boards: bool = True
) -> list[dict[str, Any]]:
    """The devices to publish: unhealthy ones tainted when taints is True, left out otherwise.

    counters False: the API server does not keep shared counters, so board devices that need them are left
    out (a board and its chips must never be allocated together) and chips consume none; boards False
    leaves those board devices out while that is not known yet.
    """
    bodies = []
    for device in content.devices:
        if not device.healthy and not taints:
            continue
        if device.kind == BOARD and device.counter_set and not (counters and boards):
            continue
        body = device_body(device, content.driver_version, pcie_roots)
        if not counters:
            body.pop("consumesCounters", None)
        if not device.healthy:
            body["taints"] = [unhealthy_taint(device)]
            if device.healing:
                body["taints"].append({"key": HEALING_TAINT, "value": device.healing, "effect": TAINT_EFFECT})
        bodies.append(body)
    return bodies


def taints_dropped(sent: list[dict[str, Any]], stored: list[Mapping[str, Any]]) -> bool:
    """True when sent had device taints and the stored slices have none: the API server does not keep them."""
    if not any("taints" in device for device in sent):
        return False
    return not any(device.get("taints") for device in _stored_devices(stored))


def counters_dropped(sent: list[dict[str, Any]], stored: list[Mapping[str, Any]]) -> bool:
    """True when sent devices consume counters and the stored ones do not: the API server drops shared counters
    (DRAPartitionableDevices off)."""
    if not any("consumesCounters" in device for device in sent):
        return False
    kept_sets = any((obj.get("spec") or {}).get("sharedCounters") for obj in stored)
    return not kept_sets or not any(device.get("consumesCounters") for device in _stored_devices(stored))


def sharing_dropped(sent: list[dict[str, Any]], stored: list[Mapping[str, Any]]) -> bool:
    """True when sent devices allow multiple allocations and the stored ones do not (DRAConsumableCapacity off)."""
    if not any(device.get("allowMultipleAllocations") for device in sent):
        return False
    return not any(device.get("allowMultipleAllocations") for device in _stored_devices(stored))


def _stored_devices(stored: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [device for obj in stored for device in (obj.get("spec") or {}).get("devices") or []]
