"""What a container gets, against the rules of Iluvatar's plugin 4.4.0 (the one ours replaces).

`iluvatar_440` restates 4.4.0's Allocate: pkg/dpm/plugin.go `iluvatarDevicePlugin.Allocate`, with
pkg/gpuallocator/deviceset.go `Device.GenerateSpecList` (a node per chip, same path in the container) and
`Device.GenerateIDS` (every chip's UUID). Ours must give the same device nodes at the same container paths
and the same IX_REPLICA_DEVICES in every case, and the same IX_VISIBLE_DEVICES everywhere but the one case the
README's "What a container gets" explains: the whole node with boards of several chips, where 4.4.0 lists the
requested board IDs (one chip's UUID per board) and ours every chip.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from ix_device_plugin.core.allocation import allocate
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.core.plan import REPLICA_SEPARATOR, Plan, plan
from ix_device_plugin.hardware.simulated import parse_spec
from ix_device_plugin.settings.config import Config

CONTROL_NODE = "/dev/itrctl"


@dataclass(frozen=True)
class Answer:
    """One container's answer: device nodes (host path, container path) and the two variables."""

    specs: tuple[tuple[str, str], ...]
    visible: tuple[str, ...]
    replica_ids: tuple[str, ...]


def iluvatar_440(p: Plan, requested: list[str]) -> Answer:
    """4.4.0's answer for one container request on the node p describes (IDs as 4.4.0 advertises them)."""
    gpus: dict[str, tuple[tuple[str, int], ...]] = {}  # physical GPU (its ID prefix) -> its chips (UUID, minor)
    for device in p.devices:
        gpus[device.gpu] = tuple((chip.uuid, chip.minor) for chip in device.chips if chip.minor is not None)
    specs: list[tuple[str, str]] = []
    visible: list[str] = []
    # "if all of the device is allocated": devSet.Replicas == 0 and as many IDs as devSet.Devices (physical GPUs)
    if p.replicas == 0 and len(requested) == len(gpus):
        minors = sorted(minor for chips in gpus.values() for _, minor in chips)
        specs = [(f"/dev/iluvatar{minor}", f"/dev/iluvatar{index}") for index, minor in enumerate(minors)]
        visible = list(requested)  # deviceIDs = req.DevicesIDs
    else:
        seen: set[str] = set()
        for device_id in requested:
            gpu = device_id.split(REPLICA_SEPARATOR)[0]  # Alias(id).Prefix()
            if gpu in seen:
                continue
            seen.add(gpu)
            specs += [(f"/dev/iluvatar{minor}", f"/dev/iluvatar{minor}") for _, minor in gpus[gpu]]  # GenerateSpecList
            visible += [uuid for uuid, _ in gpus[gpu]]  # GenerateIDS
    specs += [(node, node) for node in p.control_nodes]  # allocateCommonDeviceSpecs: /dev/itrctl when present
    return Answer(tuple(specs), tuple(visible), tuple(requested))


def ours(p: Plan, requested: list[str]) -> Answer:
    result = allocate(p, requested)
    return Answer(
        result.device_specs,
        tuple(result.envs["IX_VISIBLE_DEVICES"].split(",")),
        tuple(result.envs["IX_REPLICA_DEVICES"].split(",")),
    )


def node(spec: str, *, splitboard: bool = False, replicas: int = 0) -> Plan:
    """The node spec describes, its minors from 9 down in steps of 2 (host paths are never container paths
    by chance), with 4.4.0's IDs for `replicas`."""
    boards = tuple(
        replace(board, chips=tuple(replace(chip, minor=9 - 2 * chip.minor) for chip in board.chips))
        for board in parse_spec(spec)
    )
    p = plan(Inventory(boards=boards, control_nodes=(CONTROL_NODE,)), Config(splitboard=splitboard))
    if replicas:
        # 4.4.0's IDs for time-slicing (buildDevice): `<uuid>::<i>` for i < replicas, whenever replicas >= 1.
        devices = [
            replace(device, id=f"{device.gpu}{REPLICA_SEPARATOR}{i}", replica=i)
            for device in p.devices
            for i in range(replicas)
        ]
        p = replace(p, replicas=replicas, devices=tuple(devices))
    return p


def picked(*indexes: int) -> Callable[[Plan], list[str]]:
    return lambda p: [p.devices[index].id for index in indexes]


def every(p: Plan) -> list[str]:
    return [device.id for device in reversed(p.devices)]  # the kubelet's order is its own


def one_replica_of_each_gpu(p: Plan) -> list[str]:
    return [ids[-1] for ids in p.gpu_device_ids.values()]


CASES = {
    # name: (node, the request, whether the container takes the whole node in 4.4.0's sense)
    "one board of two": (node("BI-V150:2"), picked(1), False),
    "two chips of four, split": (node("BI-V150:2", splitboard=True), picked(2, 0), False),
    "whole node, split": (node("BI-V150:2", splitboard=True), every, True),
    "whole node, one-chip boards": (node("BI-V100:3"), every, True),
    "whole node, mixed boards, split": (node("BI-V150:1,BI-V100:1", splitboard=True), every, True),
    "whole node, two-chip boards": (node("BI-V150:2"), every, True),
    "replicas: 2, every replica": (node("BI-V150:2", replicas=2), every, False),
    "replicas: 2, one replica of each GPU": (node("BI-V150:2", replicas=2), one_replica_of_each_gpu, False),
    "replicas: 1, every GPU": (node("BI-V150:2", replicas=1), every, False),
    "replicas: 1, every GPU, split": (node("BI-V150:2", splitboard=True, replicas=1), every, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_device_nodes_and_replica_ids_are_iluvatars(name: str) -> None:
    p, request, whole_node = CASES[name]
    requested = request(p)
    theirs, mine = iluvatar_440(p, requested), ours(p, requested)

    if whole_node:
        assert mine.specs == theirs.specs
        chip_paths = [container for host, container in mine.specs if host != CONTROL_NODE]
        assert chip_paths == [f"/dev/iluvatar{i}" for i in range(len(chip_paths))]  # from 0, in host minor order
    else:
        # 4.4.0 takes a board's chips from a Go map: their order varies from call to call, ours is the board's.
        assert Counter(mine.specs) == Counter(theirs.specs)
        assert all(host == container for host, container in mine.specs)
    assert mine.replica_ids == theirs.replica_ids == tuple(requested)


@pytest.mark.parametrize("name", [name for name in CASES if name != "whole node, two-chip boards"])
def test_visible_devices_are_iluvatars(name: str) -> None:
    p, request, _ = CASES[name]
    requested = request(p)
    assert Counter(ours(p, requested).visible) == Counter(iluvatar_440(p, requested).visible)


def test_whole_node_of_two_chip_boards_lists_every_chip_where_iluvatar_lists_one_per_board() -> None:
    p, request, _ = CASES["whole node, two-chip boards"]
    requested = request(p)
    theirs, mine = iluvatar_440(p, requested), ours(p, requested)

    assert theirs.visible == tuple(requested)  # a board's ID is its first chip's UUID
    assert mine.visible == tuple(chip.uuid for device_id in requested for chip in p.by_id[device_id].chips)
    second_chips = {device.chips[1].uuid for device in p.devices}
    assert set(mine.visible) - set(theirs.visible) == second_chips
    # the same as 4.4.0 gives a container that takes the boards one at a time
    assert Counter(mine.visible) == Counter(v for device_id in requested for v in iluvatar_440(p, [device_id]).visible)
