"""The pure DRA core from inventory to slice devices: versions, PCIe roots, attributes, taints."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers.dra_core import inventory

from ix_device_plugin.core.inventory import Board, ChipStatus, Inventory
from ix_device_plugin.dra.slices import (
    PCIE_ROOT_ATTRIBUTE,
    device_body,
    semver,
    slice_content,
    slice_devices,
    taints_dropped,
)
from ix_device_plugin.hardware.pcie import pcie_root, pcie_roots


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4.1.0", "4.1.0"),
        ("v3.4", "3.4.0"),
        ("4.2.0.20240101", "4.2.0+20240101"),
        ("04.01.3-rc1", "4.1.3+rc1"),
        ("simulated", None),
        ("", None),
    ],
)
def test_driver_versions_are_semver_normalised(text: str, expected: str | None) -> None:
    assert semver(text) == expected


def test_the_pcie_root_comes_from_the_sysfs_path(tmp_path: Path) -> None:
    assert pcie_root("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0") == "pci0000:3a"
    assert pcie_root("/sys/devices/virtual/foo") is None
    device = tmp_path / "devices" / "pci0000:10" / "0000:10:00.0"
    device.mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices" / "0000:10:00.0").symlink_to(device)
    chips = inventory("BI-V100:1")
    chip = next(chips.chips())
    eight_digit = replace(chips, boards=(replace(chips.boards[0], chips=(replace(chip, bus_id="00000000:10:00.0"),)),))
    assert pcie_roots(chips, tmp_path) == {chip.bus_id: "pci0000:10"}
    assert pcie_roots(eight_digit, tmp_path) == {"00000000:10:00.0": "pci0000:10"}


def test_each_chip_is_a_device_with_the_contract_attributes() -> None:
    content = slice_content(inventory())
    assert [d.name for d in content.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "board-0", "board-2"]
    device = content.devices[1]
    body = device_body(
        replace(device, chips=(replace(device.chip, numa_node=1),)),
        content.driver_version,
        {device.chip.bus_id: "pci0000:10"},
    )
    assert body["attributes"] == {
        "uuid": {"string": device.chip.uuid},
        "productName": {"string": "BI-V150"},
        "boardUUID": {"string": content.devices[0].chip.uuid},
        "minor": {"int": 1},
        "numaNode": {"int": 1},
        "driverVersion": {"version": "4.1.0"},
        PCIE_ROOT_ATTRIBUTE: {"string": "pci0000:10"},
        "resource.kubernetes.io/pciBusID": {"string": device.chip.bus_id},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "type": {"string": "chip"},
        "wholeBoard": {"bool": False},
        "extendedResource": {"bool": False},
        "shared": {"bool": False},
    }
    assert body["capacity"] == {"memory": {"value": f"{device.chip.memory_mib}Mi"}}
    assert body["consumesCounters"] == [
        {"counterSet": "board-0", "counters": {"gpu-1": {"value": "1"}, "chips": {"value": "1"}}}
    ]


def test_a_chip_without_a_minor_is_left_out_with_a_warning() -> None:
    base = inventory("BI-V100:2")
    boards = (replace(base.boards[0], chips=(replace(base.boards[0].chips[0], minor=None),)), base.boards[1])
    content = slice_content(replace(base, boards=boards))
    assert [d.name for d in content.devices] == ["gpu-1"]
    assert "minor number is unknown" in content.warnings[0]
    split = inventory("BI-V150:1")
    half = replace(split.boards[0], chips=(replace(split.boards[0].chips[0], minor=None), split.boards[0].chips[1]))
    content = slice_content(replace(split, boards=(half,)))
    assert [d.name for d in content.devices] == ["gpu-1"]  # and no board device, which would lack a chip
    assert "board-1 left out of the ResourceSlice" in content.warnings[1]


def test_unhealthy_chips_are_tainted_or_left_out() -> None:
    base = inventory("BI-V100:2")
    sick = base.with_statuses({base.boards[1].chips[0].uuid: ChipStatus(errors=frozenset({"ECC", "PCIE"}))})
    content = slice_content(sick)
    tainted = slice_devices(content, {}, taints=True)
    assert tainted[1]["taints"] == [{"key": "gpu.iluvatar.com/unhealthy", "effect": "NoSchedule", "value": "ECC_PCIE"}]
    assert [d["name"] for d in slice_devices(content, {}, taints=False)] == ["gpu-0"]
    assert taints_dropped(tainted, [{"spec": {"devices": slice_devices(content, {}, taints=False)}}])
    assert not taints_dropped(tainted, [{"spec": {"devices": tainted}}])


def test_what_self_healing_does_about_an_unhealthy_chip_is_a_taint_beside_it_and_its_boards() -> None:
    base = inventory("BI-V150:1")
    chip = base.boards[0].chips[1]
    healing = base.with_statuses({chip.uuid: ChipStatus(xids=frozenset({48}), care="reset-unavailable")})
    published = {d["name"]: d for d in slice_devices(slice_content(healing), {}, taints=True)}
    word = {"key": "gpu.iluvatar.com/healing", "value": "reset-unavailable", "effect": "NoSchedule"}
    assert published["gpu-1"]["taints"][1] == word and published["board-0"]["taints"][1] == word
    assert "taints" not in published["gpu-0"]
    # A word for a chip in service (its status read healthy again) shows nothing: only the unhealthy are tainted.
    back = base.with_statuses({chip.uuid: ChipStatus(care="resetting")})
    assert all("taints" not in d for d in slice_devices(slice_content(back), {}, taints=True))


def test_a_board_without_chips_gives_no_devices() -> None:
    assert slice_content(Inventory(boards=(Board("BI-V100", ()),))).devices == ()
