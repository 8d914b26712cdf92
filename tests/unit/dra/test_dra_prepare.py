"""The pure DRA core from an allocated claim to prepared devices, and the refusals that say why (a device out of
service among them, unless the allocation tolerates its taints)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.dra_core import REF, allocated_claim, inventory, node_view, prepared_for

from ix_device_plugin.core.inventory import ChipStatus
from ix_device_plugin.dra.claims import NodeView, prepare
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef
from ix_device_plugin.dra.slices import slice_content


def test_prepare_gives_the_chips_their_cdi_ids_and_the_claim_its_env() -> None:
    prepared = prepare(REF, allocated_claim("gpu-2", "gpu-3"), node_view(control_nodes=("/dev/itrctl",)), {})
    assert [d.cdi_ids for d in prepared.devices] == [
        ("gpu.iluvatar.com/claim=uid-1-gpu-2", "gpu.iluvatar.com/metadata=uid-1_gpu"),  # the request's first
        ("gpu.iluvatar.com/claim=uid-1-gpu-3",),
    ]
    uuids = ",".join(prepared.uuids)
    assert prepared.spec["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/itrctl"}],
        "env": [
            f"IX_VISIBLE_DEVICES={uuids}",
            f"ILUVATAR_COREX_VISIBLE_DEVICES={uuids}",
            f"IX_REPLICA_DEVICES={uuids}",
            f"ILUVATAR_COREX_REPLICA_DEVICES={uuids}",
        ],
    }
    assert prepared.spec["cdiVersion"] == "0.3.0"


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (allocated_claim("gpu-0", uid="other"), "the claim was replaced"),
        ({"metadata": {"uid": "uid-1"}, "status": {}}, "not allocated"),
        (allocated_claim("gpu-0", pool="node-b"), "pool node-b"),
        (allocated_claim("gpu-7"), "'gpu-7' is not on this node"),
    ],
)
def test_claims_that_cannot_be_prepared_say_why(claim: dict, message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        prepared_for(claim)


def test_a_chip_held_by_another_claim_is_refused_naming_the_holder() -> None:
    holder = prepared_for(allocated_claim("gpu-0", uid="uid-0"), ClaimRef("ns", "holder", "uid-0"))
    with pytest.raises(ClaimError, match=r"prepared for claim ns/holder \(uid uid-0\)"):
        prepared_for(allocated_claim("gpu-0"), others={"uid-0": holder})


# ---- a device out of service -------------------------------------------------------------------------------


NEEDS_OPERATOR = ChipStatus(xids=frozenset({64}), care="needs-operator")


def sick_view(minor: int = 1, status: ChipStatus = NEEDS_OPERATOR) -> NodeView:
    """Two BI-V150 boards, chip minor out of service with status (by default XID 64, waiting for an operator)."""
    boards = tuple(
        replace(board, chips=tuple(replace(c, status=status) if c.minor == minor else c for c in board.chips))
        for board in inventory().boards
    )
    return NodeView(slice_content(replace(inventory(), boards=boards)).by_name(), "node-a", (), Path("/"))


def tolerating(claim: dict, *tolerations: Any, admin: bool = False) -> dict:
    for result in claim["status"]["allocation"]["devices"]["results"]:
        result["tolerations"] = list(tolerations)
        if admin:
            result["adminAccess"] = True
    return claim


def test_a_device_out_of_service_is_refused_naming_the_chip_why_and_the_taint_not_tolerated() -> None:
    view = sick_view()
    uuid = view.devices["gpu-1"].chip.uuid
    with pytest.raises(ClaimError) as refused:
        prepare(REF, allocated_claim("gpu-1"), view, {})
    assert str(refused.value) == (
        f"claim default/claim (uid uid-1): device gpu-1 ({uuid}) is out of service: XID 64 (self-healing: "
        "needs-operator); its allocation does not tolerate the taint gpu.iluvatar.com/unhealthy=XID-64:NoSchedule, "
        "so it is prepared once the chip is back in service (healed by a reset or returned by an operator); the "
        "kubelet tries again"
    )


def test_a_board_out_of_service_names_each_of_its_chips_and_which_one_is_sick() -> None:
    view = sick_view(minor=1, status=ChipStatus(errors=frozenset({"ECC"})))
    chips = ", ".join(chip.uuid for chip in view.devices["board-0"].chips)
    with pytest.raises(ClaimError, match=rf"device board-0 \({chips}\) is out of service: gpu-1: ECC; its alloc"):
        prepare(REF, allocated_claim("board-0"), view, {})
    assert prepare(REF, allocated_claim("board-2"), view, {}).devices[0].device == "board-2"  # the other board


@pytest.mark.parametrize("admin", [False, True])
def test_a_device_out_of_service_is_prepared_only_where_every_taint_it_carries_is_tolerated(admin: bool) -> None:
    view = sick_view()
    unhealthy = {"key": "gpu.iluvatar.com/unhealthy", "operator": "Exists"}
    healing = {"key": "gpu.iluvatar.com/healing", "value": "needs-operator", "effect": "NoSchedule"}
    for tolerations, why in [  # none; one key of the two; both keys, the first with another value
        ((), "the taint gpu.iluvatar.com/unhealthy=XID-64:NoSchedule"),
        ((unhealthy,), "the taint gpu.iluvatar.com/healing=needs-operator:NoSchedule"),
        (({"key": "gpu.iluvatar.com/unhealthy", "value": "XID-46"}, healing), "the taint gpu.iluvatar.com/unhealthy="),
    ]:
        with pytest.raises(ClaimError, match=rf"does not tolerate {why}"):
            prepare(REF, tolerating(allocated_claim("gpu-1"), *tolerations, admin=admin), view, {})
    for tolerations in [(unhealthy, healing), ({"operator": "Exists"},)]:
        prepared = prepare(REF, tolerating(allocated_claim("gpu-1"), *tolerations, admin=admin), view, {})
        assert [(device.device, device.admin) for device in prepared.devices] == [("gpu-1", admin)]


def test_a_claim_prepared_before_keeps_its_device_out_of_service_and_a_healthy_one_needs_no_toleration() -> None:
    view = sick_view()
    assert prepare(REF, allocated_claim("gpu-1"), view, {}, again=True).devices[0].device == "gpu-1"
    assert prepare(REF, allocated_claim("gpu-0"), view, {}).devices[0].device == "gpu-0"


def test_tolerations_that_are_not_a_list_of_objects_fail_the_claim_naming_the_device() -> None:
    claim = allocated_claim("gpu-0")
    claim["status"]["allocation"]["devices"]["results"][0]["tolerations"] = [{"operator": 1}]
    with pytest.raises(ClaimError, match=r"^claim default/claim \(uid uid-1\): device 'gpu-0': tolerations\[0\]\.op"):
        prepared_for(claim)  # a healthy device too: the result is not well formed
