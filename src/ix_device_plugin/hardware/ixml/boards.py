"""How the chips sit: which share a board (board position and nvmlDeviceOnSameBoard), how far apart on PCIe."""

from __future__ import annotations

import ctypes

from ix_device_plugin.core.inventory import Board, link_key
from ix_device_plugin.hardware.ixml.devices import Device
from ix_device_plugin.hardware.ixml.library import CallError, Library


def boards(library: Library, devices: list[Device]) -> tuple[Board, ...]:
    """The devices as boards, in enumeration order of each board's first chip; chips by board position.

    A chip the library cannot place (no board position, or no nvmlDeviceOnSameBoard) is a board of its
    own whose membership is not known, as Iluvatar's plugin treats it: a single-chip board.
    """
    ordered = [
        (sorted(members, key=lambda device: (device.position or 0, device.index)), known)
        for members, known in _board_groups(library, devices)
    ]
    ordered.sort(key=lambda group: min(device.index for device in group[0]))
    return tuple(
        Board(product=members[0].chip.product, chips=tuple(device.chip for device in members), membership_known=known)
        for members, known in ordered
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


def _board_groups(library: Library, devices: list[Device]) -> list[tuple[list[Device], bool]]:
    """Devices grouped by board, each group with whether the library said which chips it has.

    Each chip with a board position joins the position-0 chip it shares a board with; a chip without
    one is a group of its own.
    """
    alone = [([device], False) for device in devices]
    if not (library.has("board_position") and library.has("same_board")):
        return alone
    leaders = [d for d in devices if d.position == 0 and d.handle is not None]
    groups: dict[int, list[Device]] = {leader.index: [leader] for leader in leaders}
    unplaced: list[Device] = []
    for device in devices:
        if device.position == 0 and device.handle is not None:
            continue
        if device.position is None or device.handle is None:
            unplaced.append(device)
            continue
        try:
            leader = _board_leader(library, device, leaders)
        except CallError:
            return alone
        groups.setdefault(leader.index if leader else device.index, []).append(device)
    return [(members, True) for members in groups.values()] + [([device], False) for device in unplaced]


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
