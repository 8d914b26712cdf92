"""The pure DRA core from an allocated claim to prepared devices, and the refusals that say why."""

from __future__ import annotations

import pytest
from helpers.dra_core import REF, allocated_claim, node_view, prepared_for

from ix_device_plugin.dra.claims import prepare
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef


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
