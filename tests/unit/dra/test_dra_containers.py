"""What each device of a pod's own claims is to name: its containers' whole holding, when they agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.dra.claimspec import Holding, cdi_device_name, claim_spec, with_container_holdings
from ix_device_plugin.dra.containers import PodRef, container_holdings, owner_pod
from ix_device_plugin.dra.prepared import ClaimRef, PreparedClaim, PreparedDevice
from ix_device_plugin.dra.slices import slice_content
from ix_device_plugin.hardware.simulated import parse_spec

POOL = "node-a"


def claim(name: str, *devices: tuple[str, str, tuple[str, ...]]) -> PreparedClaim:
    """A prepared claim of devices (device name, chip UUID, requests)."""
    uid = f"uid-{name}"
    prepared = tuple(
        PreparedDevice(requests, POOL, device, uuid, (f"gpu.iluvatar.com/claim={uid}-{device}",))
        for device, uuid, requests in devices
    )
    return PreparedClaim(ClaimRef("default", name, uid), prepared, {})


def pod(containers: dict[str, list[dict[str, str]]], templates: list[str], init: dict[str, Any] | None = None) -> Any:
    names = sorted({ref["name"] for refs in containers.values() for ref in refs})
    entries = [
        {"name": n, "resourceClaimTemplateName": "t"} if n in templates else {"name": n, "resourceClaimName": n}
        for n in names
    ]
    spec: dict[str, Any] = {
        "containers": [{"name": c, "resources": {"claims": refs}} for c, refs in containers.items()],
        "resourceClaims": entries,
    }
    if init:
        spec["initContainers"] = [init]
    statuses = [{"name": n, "resourceClaimName": n} for n in names if n in templates]
    return {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": spec,
        "status": {"resourceClaimStatuses": statuses},
    }


A = claim("a", ("gpu-0", "UUID-0", ("gpu",)))
B = claim("b", ("board-2", "UUID-2", ("gpu",)))
B_CHIPS = PreparedClaim(
    B.ref, (PreparedDevice(("gpu",), POOL, "board-2", "UUID-2", (), chips=("UUID-2", "UUID-3")),), {}
)
PREPARED = {"a": A, "b": B_CHIPS}


def name(c: PreparedClaim, index: int = 0) -> str:
    device = c.devices[index]
    return cdi_device_name(c.ref.uid, device.device, device.share_id)


def test_every_device_of_a_container_names_the_whole_holding() -> None:
    found = container_holdings(pod({"main": [{"name": "a"}, {"name": "b"}]}, ["a", "b"]), PREPARED)
    whole = Holding(("UUID-0", "UUID-2", "UUID-3"), ("UUID-0", "UUID-2"))
    assert found.by_claim == {A.ref.uid: {name(A): whole}, B.ref.uid: {name(B_CHIPS): whole}}
    assert found.warnings == ()


def test_containers_of_one_pod_each_name_their_own() -> None:
    found = container_holdings(pod({"one": [{"name": "a"}], "two": [{"name": "b"}]}, ["a", "b"]), PREPARED)
    assert found.by_claim[A.ref.uid] == {name(A): Holding(("UUID-0",), ("UUID-0",))}
    assert found.by_claim[B.ref.uid] == {name(B_CHIPS): Holding(("UUID-2", "UUID-3"), ("UUID-2",))}


def test_containers_holding_the_same_chips_in_another_order_agree() -> None:
    found = container_holdings(
        pod({"x": [{"name": "a"}, {"name": "b"}], "y": [{"name": "b"}, {"name": "a"}]}, ["a", "b"]), PREPARED
    )
    assert set(found.by_claim) == {A.ref.uid, B.ref.uid} and found.warnings == ()


def test_a_device_whose_containers_hold_different_chips_is_left_out_with_a_warning() -> None:
    shape = {"both": [{"name": "a"}, {"name": "b"}], "alone": [{"name": "a"}]}
    found = container_holdings(pod(shape, ["a", "b"]), PREPARED)
    assert A.ref.uid not in found.by_claim
    assert list(found.by_claim[B.ref.uid].values()) == [Holding(("UUID-0", "UUID-2", "UUID-3"), ("UUID-0", "UUID-2"))]
    (warning,) = found.warnings
    assert name(A) in warning and "both: UUID-0,UUID-2,UUID-3" in warning and "alone: UUID-0" in warning


def test_a_claim_of_its_own_names_nothing_but_counts_in_the_pods_claims() -> None:
    found = container_holdings(pod({"main": [{"name": "a"}, {"name": "b"}]}, ["b"]), PREPARED)
    assert A.ref.uid not in found.by_claim
    assert found.by_claim[B.ref.uid][name(B_CHIPS)].visible == ("UUID-0", "UUID-2", "UUID-3")


def test_a_request_reference_takes_that_requests_devices_and_subrequests() -> None:
    two = claim("t", ("gpu-0", "UUID-0", ("first/large",)), ("gpu-1", "UUID-1", ("second",)))
    shape = {"x": [{"name": "t", "request": "first"}], "y": [{"name": "t", "request": "second"}]}
    found = container_holdings(pod(shape, ["t"]), {"t": two})
    assert found.by_claim[two.ref.uid] == {
        name(two, 0): Holding(("UUID-0",), ("UUID-0",)),
        name(two, 1): Holding(("UUID-1",), ("UUID-1",)),
    }


def test_init_containers_count_and_other_drivers_claims_are_skipped() -> None:
    init = {"name": "setup", "resources": {"claims": [{"name": "a"}, {"name": "other-driver"}]}}
    shape = {"main": [{"name": "a"}, {"name": "other-driver"}]}
    found = container_holdings(pod(shape, ["a", "other-driver"], init), {"a": A})
    assert found.by_claim == {A.ref.uid: {name(A): Holding(("UUID-0",), ("UUID-0",))}}


def test_a_pod_of_unexpected_shape_names_nothing() -> None:
    for shape in (None, {}, {"spec": []}, {"spec": {"containers": "x"}}, {"spec": {"containers": [{"resources": 1}]}}):
        assert container_holdings(shape, PREPARED).by_claim == {}


def test_the_owner_pod_is_the_controlling_pod_reference() -> None:
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}
    made = {"metadata": {"namespace": "ns", "ownerReferences": [owner]}}
    assert owner_pod(made) == PodRef("ns", "p", "u")
    for other in ({**owner, "controller": False}, {**owner, "kind": "Job"}, {**owner, "uid": ""}):
        assert owner_pod({"metadata": {"namespace": "ns", "ownerReferences": [other]}}) is None
    assert owner_pod({"metadata": {"namespace": "ns"}}) is None and owner_pod("x") is None


def test_the_devices_edits_are_set_and_cleared_and_the_claims_own_env_stays() -> None:
    chip = slice_content(Inventory(boards=parse_spec("BI-V150:1"))).by_name()["gpu-0"]
    spec = claim_spec("uid-a", [(A.devices[0], chip)], ("/dev/itrctl",), Path("/"))
    whole = Holding(("UUID-0", "UUID-9"), ("UUID-0", "UUID-9"))
    named = with_container_holdings(spec, {name(A): whole})
    assert named["devices"][0]["containerEdits"]["env"][0] == "IX_VISIBLE_DEVICES=UUID-0,UUID-9"
    assert named["containerEdits"] == spec["containerEdits"] and "env" not in spec["devices"][0]["containerEdits"]
    assert with_container_holdings(named, {}) == spec
