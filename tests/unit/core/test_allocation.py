"""Allocate and GetPreferredAllocation rules, on plans built from simulated inventories."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from ix_device_plugin.core.allocation import AllocationError, allocate
from ix_device_plugin.core.inventory import Board, Chip, ChipStatus, Inventory, link_key
from ix_device_plugin.core.plan import Plan, plan
from ix_device_plugin.core.preferred import preferred
from ix_device_plugin.hardware.simulated import parse_spec
from ix_device_plugin.settings.config import Config


def make_plan(spec: str = "BI-V150:2", control: tuple[str, ...] = (), **config: object) -> Plan:
    return plan(Inventory(boards=parse_spec(spec), control_nodes=control), Config(**config))  # type: ignore[arg-type]


def test_board_device_gets_both_chip_nodes_and_uuids() -> None:
    p = make_plan()
    board = p.devices[1]
    result = allocate(p, [board.id])
    assert result.device_nodes == ("/dev/iluvatar2", "/dev/iluvatar3")
    uuids = ",".join(chip.uuid for chip in board.chips)
    assert result.envs == {
        "IX_VISIBLE_DEVICES": uuids,
        "IX_REPLICA_DEVICES": board.id,
        "ILUVATAR_COREX_VISIBLE_DEVICES": uuids,
        "ILUVATAR_COREX_REPLICA_DEVICES": board.id,
    }


def test_control_node_is_added_when_present() -> None:
    p = make_plan("BI-V100:2", control=("/dev/itrctl",))
    assert allocate(p, [p.devices[0].id]).device_nodes == ("/dev/iluvatar0", "/dev/itrctl")


def test_several_replicas_of_one_gpu_give_its_nodes_once() -> None:
    p = make_plan("BI-V150:1", replicas=4)
    ids = [d.id for d in p.devices[:3]]
    result = allocate(p, ids)
    assert result.device_nodes == ("/dev/iluvatar0", "/dev/iluvatar1")
    assert result.envs["IX_VISIBLE_DEVICES"].count("GPU-") == 2
    assert result.envs["IX_REPLICA_DEVICES"] == ",".join(ids)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([], "no device IDs"),
        (["GPU-nope"], "unknown device ID 'GPU-nope'"),
        (["\x00\xff"], "unknown device ID"),
    ],
)
def test_bad_ids_are_named(ids: list[str], message: str) -> None:
    with pytest.raises(AllocationError, match=message):
        allocate(make_plan(), ids)


def test_duplicate_ids_are_refused() -> None:
    p = make_plan()
    with pytest.raises(AllocationError, match=f"device ID '{p.devices[0].id}' requested twice"):
        allocate(p, [p.devices[0].id, p.devices[0].id])


def test_unhealthy_device_is_refused_as_unavailable() -> None:
    inv = Inventory(boards=parse_spec("BI-V100:1"))
    inv = inv.with_statuses({inv.boards[0].uuid: ChipStatus(errors=frozenset({"ECC"}))})
    p = plan(inv, Config())
    with pytest.raises(AllocationError, match=r"is Unhealthy .*ECC") as caught:
        allocate(p, [p.devices[0].id])
    assert caught.value.unavailable


def test_fail_requests_greater_than_one() -> None:
    p = make_plan("BI-V100:2", replicas=4, fail_requests_greater_than_one=True)
    allocate(p, [p.devices[0].id])
    with pytest.raises(AllocationError, match="failRequestsGreaterThanOne"):
        allocate(p, [p.devices[0].id, p.devices[4].id])
    unshared = make_plan("BI-V100:2", fail_requests_greater_than_one=True)
    assert len(allocate(unshared, [d.id for d in unshared.devices]).device_nodes) == 2


def test_unknown_minor_is_refused() -> None:
    chip = Chip(uuid="GPU-x", minor=None, product="BI-V100", status=ChipStatus())
    p = plan(Inventory(boards=(Board("BI-V100", (chip,)),)), Config())
    with pytest.raises(AllocationError, match="no known device node"):
        allocate(p, ["GPU-x"])


# ---- GetPreferredAllocation ------------------------------------------------------------------


def numa_inventory(numa_of_boards: list[int]) -> Inventory:
    boards = parse_spec(f"BI-V100:{len(numa_of_boards)}")
    return Inventory(
        boards=tuple(
            replace(board, chips=tuple(replace(c, numa_node=node) for c in board.chips))
            for board, node in zip(boards, numa_of_boards, strict=True)
        )
    )


def test_preferred_returns_exact_size_from_available_with_must_include() -> None:
    p = make_plan("BI-V100:6")
    ids = [d.id for d in p.devices]
    chosen = preferred(p, ids[1:], [ids[4]], 3)
    assert len(chosen) == 3 and len(set(chosen)) == 3
    assert ids[4] in chosen
    assert set(chosen) <= set(ids[1:])


def test_preferred_keeps_to_one_numa_node() -> None:
    p = plan(numa_inventory([0, 1, 0, 1, 1, 0]), Config())
    ids = [d.id for d in p.devices]
    chosen = preferred(p, ids, [ids[1]], 3)
    assert {p.by_id[i].numa_nodes for i in chosen} == {(1,)}
    chosen = preferred(p, ids, [], 2)
    assert len({p.by_id[i].numa_nodes for i in chosen}) == 1


def test_preferred_picks_the_tightest_numa_node_that_fits() -> None:
    p = plan(numa_inventory([0, 0, 0, 1, 1]), Config())
    chosen = preferred(p, [d.id for d in p.devices], [], 2)
    assert {p.by_id[i].numa_nodes for i in chosen} == {(1,)}


def test_preferred_spreads_replicas_over_gpus_least_used_first() -> None:
    p = make_plan("BI-V100:3", replicas=4)
    by_gpu = {gpu: [d.id for d in p.devices if d.gpu == gpu] for gpu in dict.fromkeys(d.gpu for d in p.devices)}
    gpus = list(by_gpu)
    # GPU 0 has 3 replicas in use, GPU 1 has 1, GPU 2 none.
    available = by_gpu[gpus[0]][3:] + by_gpu[gpus[1]][1:] + by_gpu[gpus[2]]
    chosen = preferred(p, available, [], 2)
    assert [p.by_id[i].gpu for i in chosen] == [gpus[2], gpus[1]]
    chosen = preferred(p, available, [], 3)
    assert Counter(p.by_id[i].gpu for i in chosen) == Counter(gpus)
    chosen = preferred(p, available, [], 5)
    assert Counter(p.by_id[i].gpu for i in chosen) == Counter({gpus[2]: 2, gpus[1]: 2, gpus[0]: 1})


def test_preferred_prefers_pcie_neighbours() -> None:
    inv = Inventory(boards=parse_spec("BI-V100:4"))
    uuids = [b.uuid for b in inv.boards]
    links = {link_key(a, b): 40 for i, a in enumerate(uuids) for b in uuids[i + 1 :]}
    links[link_key(uuids[0], uuids[3])] = 10
    p = plan(replace(inv, links=links), Config())
    assert preferred(p, uuids, [uuids[0]], 2) == [uuids[0], uuids[3]]


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        (2, [], 3, "allocation_size 3 is larger than the 2 available"),
        (2, [], 0, "allocation_size must be at least 1"),
        (2, [3], 1, "is not in available_deviceIDs"),
        (3, [0, 1], 1, "exceed allocation_size"),
    ],
)
def test_preferred_impossible_requests(available: int, must: list[int], size: int, message: str) -> None:
    p = make_plan("BI-V100:4")
    ids = [d.id for d in p.devices]
    with pytest.raises(AllocationError, match=message):
        preferred(p, ids[:available], [ids[i] for i in must], size)


def test_preferred_rejects_unknown_ids() -> None:
    with pytest.raises(AllocationError, match="unknown device ID 'nope'"):
        preferred(make_plan(), ["nope"], [], 1)


def test_preferred_names_the_repeated_or_unknown_id_among_many() -> None:
    p = make_plan("BI-V150:4", replicas=8)
    ids = [d.id for d in p.devices]
    with pytest.raises(AllocationError, match=f"available_deviceIDs: device ID '{ids[5]}' requested twice"):
        preferred(p, [*ids, ids[5]], [], 2)
    with pytest.raises(AllocationError, match="available_deviceIDs: unknown device ID 'GPU-gone::0'"):
        preferred(p, [*ids[:7], "GPU-gone::0", *ids[7:]], [], 2)
    with pytest.raises(AllocationError, match="available_deviceIDs: no device IDs given"):
        preferred(p, [], [], 1)


def test_of_equally_good_gpus_the_first_offered_comes_first() -> None:
    p = make_plan("BI-V100:4", replicas=2)
    ids = [d.id for d in p.devices]
    offered = ids[6:] + ids[:6]  # the kubelet's order: the last GPU first
    assert preferred(p, offered, [], 1) == [ids[6]]
    assert [p.by_id[i].gpu for i in preferred(p, offered, [], 3)] == [
        p.devices[6].gpu,
        *(d.gpu for d in p.devices[:4:2]),
    ]


def _with_minors(minors: list[int]) -> Plan:
    boards = tuple(Board("BI-V100", (Chip(uuid=f"GPU-{minor}", minor=minor, product="BI-V100"),)) for minor in minors)
    return plan(Inventory(boards=boards, control_nodes=("/dev/itrctl",)), Config())


def test_a_container_given_the_whole_node_sees_its_gpus_from_0_in_host_minor_order() -> None:
    p = _with_minors([7, 2, 5])
    result = allocate(p, [d.id for d in reversed(p.devices)])
    assert result.device_specs == (
        ("/dev/iluvatar2", "/dev/iluvatar0"),
        ("/dev/iluvatar5", "/dev/iluvatar1"),
        ("/dev/iluvatar7", "/dev/iluvatar2"),
        ("/dev/itrctl", "/dev/itrctl"),
    )


def test_a_container_given_part_of_the_node_keeps_host_paths() -> None:
    p = _with_minors([7, 2, 5])
    result = allocate(p, [p.devices[0].id, p.devices[2].id])
    assert result.device_specs == (
        ("/dev/iluvatar7", "/dev/iluvatar7"),
        ("/dev/iluvatar5", "/dev/iluvatar5"),
        ("/dev/itrctl", "/dev/itrctl"),
    )


def test_whole_node_order_does_not_apply_to_shared_replicas() -> None:
    p = plan(
        Inventory(boards=(Board("BI-V100", (Chip(uuid="GPU-3", minor=3, product="BI-V100"),)),)), Config(replicas=2)
    )
    result = allocate(p, [d.id for d in p.devices])
    assert result.device_specs == (("/dev/iluvatar3", "/dev/iluvatar3"),)


def test_cdi_cri_names_every_chip_once_and_gives_no_device_specs() -> None:
    p = make_plan("BI-V150:1", control=("/dev/itrctl",), replicas=2, device_list_strategy=("cdi-cri",))
    result = allocate(p, [d.id for d in p.devices])  # two replicas of one board
    chips = [chip.uuid for chip in p.devices[0].chips]
    assert result.cdi_devices == tuple(f"iluvatar.com/gpu={uuid}" for uuid in chips)
    assert result.device_specs == ()
    assert result.annotations == {}
    assert result.envs["IX_VISIBLE_DEVICES"] == ",".join(chips)  # envs in every mode


def test_cdi_annotations_and_device_specs_together() -> None:
    p = make_plan("BI-V100:2", device_list_strategy=("device-specs", "cdi-annotations"))
    result = allocate(p, [p.devices[1].id])
    ((key, value),) = result.annotations.items()
    assert key.startswith("cdi.k8s.io/ix-device-plugin_")
    assert value == f"iluvatar.com/gpu={p.devices[1].chips[0].uuid}"
    assert result.device_nodes == ("/dev/iluvatar1",)
    assert result.cdi_devices == ()
    assert allocate(p, [p.devices[1].id]).annotations == result.annotations  # pure: same request, same key
