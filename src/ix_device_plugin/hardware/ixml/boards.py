"""How the chips sit: which share a board (board position and nvmlDeviceOnSameBoard), how far apart on PCIe."""

from __future__ import annotations

import ctypes

from ix_device_plugin.core.inventory import Board, link_key
from ix_device_plugin.hardware.ixml.devices import Device
from ix_device_plugin.hardware.ixml.library import CallError, Library


def boards(library: Library, devices: list[Device]) -> tuple[Board, ...]:
    """The devices as boards, in enumeration order of each board's first chip; chips by board position."""
    groups = _board_groups(library, devices)
    ordered = [sorted(members, key=lambda device: (device.position or 0, device.index)) for members in groups]
    ordered.sort(key=lambda members: min(device.index for device in members))
    return tuple(
        Board(product=members[0].chip.product, chips=tuple(device.chip for device in members)) for members in ordered
    )


def links(library: Library, devices: list[Device]) -> dict[tuple[str, str], int]:
    """PCIe common-ancestor level between every pair of reachable chips the library can place."""
    if not library.has("topology"):
        return {}
    reachable = [device for device in devices if device.handle is not None]
    found: dict[tuple[str, str], int] = {}
    for i, first in enumerate(reachable):
        for second in reachable[i + 1 :]:
            level = ctypes.c_int()
            try:
                library.call("topology", first.handle, second.handle, ctypes.byref(level))
            except CallError:
                continue
            found[link_key(first.chip.uuid, second.chip.uuid)] = level.value
    return found


def _board_groups(library: Library, devices: list[Device]) -> list[list[Device]]:
    """Devices grouped by board: each chip joins the position-0 chip it shares a board with."""
    alone = [[device] for device in devices]
    if not (library.has("board_position") and library.has("same_board")):
        return alone
    leaders = [d for d in devices if d.position == 0 and d.handle is not None]
    groups: dict[int, list[Device]] = {leader.index: [leader] for leader in leaders}
    for device in devices:
        if device.position == 0 and device.handle is not None:
            continue
        leader = None
        if device.position is not None and device.handle is not None:
            try:
                leader = _board_leader(library, device, leaders)
            except CallError:
                return alone
        groups.setdefault(leader.index if leader else device.index, []).append(device)
    return list(groups.values())


def _board_leader(library: Library, device: Device, leaders: list[Device]) -> Device | None:
    """The position-0 chip on device's board; raises CallError only when boards are not supported."""
    for leader in leaders:
        same = ctypes.c_int()
        try:
            library.call("same_board", leader.handle, device.handle, ctypes.byref(same))
        except CallError as exc:
            if exc.not_supported:
                raise
            continue
        if same.value:
            return leader
    return None
