"""What another writer puts in the checkpoint, a claim spec or a claim: every field read as a total function.

A wrong type is an error naming the file (or claim) and the field, never an AttributeError or a TypeError; a
quantity is bounded before any arithmetic; a claim without a name is said to be unnamed.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core.inventory import ChipStatus, Inventory
from ix_device_plugin.dra.checkpoint import CheckpointError, checkpoint_text, parse_checkpoint
from ix_device_plugin.dra.claims import NodeView, prepare
from ix_device_plugin.dra.claimspec import SpecError, claim_from_spec
from ix_device_plugin.dra.pool import quantity
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef
from ix_device_plugin.dra.slices import SlicePolicy, slice_content
from ix_device_plugin.hardware.simulated import parse_spec

POOL = "node-a"
SHARED = SlicePolicy(splitboard=True, replicas=4)


def view(policy: SlicePolicy = SHARED) -> NodeView:
    inventory = Inventory(boards=parse_spec("BI-V150:1"), control_nodes=("/dev/itrctl",))
    return NodeView(slice_content(inventory, policy=policy).by_name(), POOL, ("/dev/itrctl",), Path("/"))


def shared_claim(uid: str, device: str, consumed: Any) -> dict[str, Any]:
    result = {"request": "gpu", "driver": "gpu.iluvatar.com", "pool": POOL, "device": device,
              "shareID": str(uuid.uuid4()), "consumedCapacity": {"shares": consumed}}  # fmt: skip
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": [result]}}}}


def a_checkpoint() -> dict[str, Any]:
    ref = ClaimRef("default", "held", "uid-1")
    claim = prepare(ref, shared_claim("uid-1", "gpu-0", "2"), view(), {})
    return json.loads(checkpoint_text({"uid-1": claim}, "boot-1"))


# ---- quantities --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1e10000000", "1e-10000000", "9" * 65, "1e31", "1" + "0" * 40 + "Ki", "NaN"])
def test_a_quantity_beyond_any_device_is_refused_at_once(text: str) -> None:
    started = time.perf_counter()
    assert quantity(text) is None
    # Converting 1e10000000 takes minutes; a second's bound tells that apart on a loaded 2-core machine too.
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1e10000000", r"consumedCapacity shares '1e10000000' is not a whole number of shares from 1 to 1024"),
        ("0.5", r"consumedCapacity shares '0.5' is not a whole number"),
        ("2000", r"consumedCapacity shares '2000' is not a whole number of shares from 1 to 1024"),
        ("5", r"device gpu-0: consumedCapacity shares 5 is more than the 4 shares the device has"),
        (5, r"consumedCapacity shares '5' is not a whole number"),  # a number, not a quantity string
    ],
)
def test_a_consumed_capacity_beyond_the_device_is_that_claims_error(value: Any, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ClaimError, match=rf"^claim default/big \(uid big\): .*{message}"):
        prepare(ClaimRef("default", "big", "big"), shared_claim("big", "gpu-0", value), view(), {})
    assert time.perf_counter() - started < 1.0


def test_one_quantity_of_shares_is_read_in_any_spelling() -> None:
    for spelling in ("2", "2.0", "2000m", "0.002k"):
        claim = prepare(ClaimRef("default", "c", "c"), shared_claim("c", "gpu-0", spelling), view(), {})
        assert claim.devices[0].shares == 2, spelling


# ---- names in messages -------------------------------------------------------------------------------------


def test_a_claim_without_a_name_is_said_to_be_unnamed_and_no_message_has_an_empty_name() -> None:
    assert str(ClaimRef("", "", "uid-9")) == "unnamed (uid uid-9)"
    with pytest.raises(ClaimError) as refused:
        prepare(ClaimRef("default", "big", "big"), shared_claim("big", "gpu-0", "5"), view(), {})
    assert "prepared for ," not in str(refused.value) and "prepared for" not in str(refused.value)
    rebuilt = claim_from_spec("uid-1", a_checkpoint()["claims"]["uid-1"]["spec"], POOL)
    with pytest.raises(ClaimError, match=r"gpu-0 has 4 shares: 2 are prepared for unnamed \(uid uid-1\), this"):
        prepare(ClaimRef("default", "c", "c"), shared_claim("c", "gpu-0", "3"), view(), {"uid-1": rebuilt})


# ---- the checkpoint --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["claims"]["uid-1"]["devices"].__setitem__(0, None), r"devices\[0\]: expected an object, got null"),
        (lambda d: d["claims"]["uid-1"]["devices"].__setitem__(0, "gpu-0"), r"devices\[0\]: expected an object, got a"),
        (lambda d: d["claims"]["uid-1"]["devices"].__setitem__(0, 7), r"devices\[0\]: expected an object, got a num"),
        (lambda d: d["claims"]["uid-1"].__setitem__("devices", {}), r"uid-1\.devices: expected a list, got an object"),
        (lambda d: d["claims"]["uid-1"].__setitem__("name", 3), r"claims\.uid-1\.name: expected a string, got a num"),
        (lambda d: d["claims"]["uid-1"].__setitem__("complete", "yes"), r"uid-1\.complete: expected true or false"),
        (lambda d: d["claims"]["uid-1"]["devices"][0].__setitem__("slots", ["0"]), r"slots: expected a list of slot"),
        (lambda d: d["claims"]["uid-1"]["devices"][0].__setitem__("shares", -1), r"shares: expected 0 or more"),
        (lambda d: d["claims"]["uid-1"]["devices"][0].__setitem__("kind", "nic"), r"kind: expected chip or board"),
        (lambda d: d["claims"]["uid-1"]["devices"][0].__setitem__("cdi_ids", [1]), r"cdi_ids: expected a list of str"),
        (lambda d: d["claims"].__setitem__("../../x", d["claims"].pop("uid-1")), r"claims\.\.\./\.\./x: not a claim"),
        (lambda d: d.__setitem__("claims", []), r"cp: claims: expected an object, got a list"),
        (lambda d: d.__setitem__("bootID", 1), r"cp: bootID: expected a string, got a number"),
        (lambda d: d.__setitem__("version", True), r"unsupported checkpoint version true"),
        (
            lambda d: d["claims"]["uid-1"].__setitem__("metadataGenerations", []),
            r"metadataGenerations: expected an obj",
        ),
        (
            lambda d: d["claims"]["uid-1"].__setitem__("metadataGenerations", {"gpu": 0}),
            r"Generations\.gpu: expected a",
        ),
        (
            lambda d: d["claims"]["uid-1"].__setitem__("metadataGenerations", {"gpu": 2**63}),
            r"Generations\.gpu: expected",
        ),
        (lambda d: d["claims"]["uid-1"].__setitem__("metadataGenerations", {"a/b": 1}), r"'a/b' is not a request name"),
    ],
)
def test_a_wrong_type_anywhere_in_the_checkpoint_is_an_error_naming_the_field(edit: Any, message: str) -> None:
    document = a_checkpoint()
    edit(document)
    with pytest.raises(CheckpointError, match=message):
        parse_checkpoint(json.dumps(document), "cp")


def test_a_pending_reset_is_kept_in_the_checkpoint() -> None:
    ref = ClaimRef("default", "held", "uid-1")
    claim = replace(prepare(ref, shared_claim("uid-1", "gpu-0", "2"), view(), {}), reset_pending=True)
    text = checkpoint_text({"uid-1": claim}, "boot-1")
    assert json.loads(text)["claims"]["uid-1"]["resetPending"] is True
    assert parse_checkpoint(text, "cp").claims["uid-1"].reset_pending
    assert (
        not parse_checkpoint(checkpoint_text({"uid-1": replace(claim, reset_pending=False)}), "cp")
        .claims["uid-1"]
        .reset_pending
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
FIELDS = ["namespace", "name", "devices", "spec", "complete", "resetPending", "metadataGenerations"]
DEVICE_FIELDS = ["requests", "pool", "device", "uuid", "cdi_ids", "admin", "share_id", "shares", "slots", "chips",
                 "kind", "config"]  # fmt: skip


@given(st.sampled_from(FIELDS), JSON, st.sampled_from(DEVICE_FIELDS), JSON)
def test_any_value_in_any_checkpoint_field_is_read_or_refused_by_name(
    field: str, value: Any, device_field: str, device_value: Any
) -> None:
    for path in ("claim", "device"):
        document = a_checkpoint()
        entry = document["claims"]["uid-1"]
        if path == "claim":
            entry[field] = value
        else:
            entry["devices"][0][device_field] = device_value
        try:
            parse_checkpoint(json.dumps(document), "cp")
        except CheckpointError as error:
            assert str(error).startswith("cp: ")


# ---- the claim's allocation ---------------------------------------------------------------------------------

RESULT_FIELDS = ["request", "device", "adminAccess", "shareID", "consumedCapacity", "tolerations"]
TOLERATION_FIELDS = ["key", "operator", "value", "effect", "tolerationSeconds"]


def sick_view() -> NodeView:
    """view(), its chips out of service for XID 64 (an operator's): every device tainted, tolerations compared."""
    inventory = Inventory(boards=parse_spec("BI-V150:1"), control_nodes=("/dev/itrctl",))
    sick = ChipStatus(xids=frozenset({64}), care="needs-operator")
    boards = tuple(replace(b, chips=tuple(replace(c, status=sick) for c in b.chips)) for b in inventory.boards)
    content = slice_content(replace(inventory, boards=boards), policy=SHARED)
    return NodeView(content.by_name(), POOL, ("/dev/itrctl",), Path("/"))


@given(st.sampled_from(RESULT_FIELDS), JSON, st.sampled_from(TOLERATION_FIELDS), JSON)
def test_any_value_in_an_allocation_result_is_read_or_refused_as_that_claims_error(
    field: str, value: Any, toleration_field: str, toleration_value: Any
) -> None:
    """Whatever the scheduler (or anyone who writes a claim's status) leaves in a result, tolerations included,
    the prepare answers or fails with the claim's error, on healthy devices and on devices out of service."""
    tolerating = {"operator": "Exists", toleration_field: toleration_value}
    for node in (view(), sick_view()):
        for edit in ({field: value}, {"tolerations": [tolerating]}, {"tolerations": [value]}):
            claim = shared_claim("uid-1", "gpu-0", "1")
            claim["status"]["allocation"]["devices"]["results"][0].update(edit)
            try:
                prepare(ClaimRef("default", "any", "uid-1"), claim, node, {})
            except ClaimError as error:
                assert str(error).startswith("claim default/any (uid uid-1): ")


# ---- the claim specs ---------------------------------------------------------------------------------------


@given(JSON)
def test_any_document_in_place_of_a_claim_spec_is_read_or_refused_with_a_reason(document: Any) -> None:
    try:
        claim_from_spec("uid-1", document, POOL)
    except SpecError as error:
        assert str(error)


@given(st.sampled_from(["kind", "devices", "containerEdits", "cdiVersion"]), JSON, st.integers(0, 3), JSON)
def test_any_value_in_a_claim_spec_field_is_read_or_refused_with_a_reason(
    field: str, value: Any, index: int, node: Any
) -> None:
    spec = a_checkpoint()["claims"]["uid-1"]["spec"]
    for edited in ({**spec, field: value}, _with_device_node(spec, node), _with_env(spec, index, value)):
        try:
            claim_from_spec("uid-1", edited, POOL)
        except SpecError as error:
            assert str(error)


def _with_device_node(spec: dict[str, Any], node: Any) -> dict[str, Any]:
    edited = json.loads(json.dumps(spec))
    edited["devices"][0]["containerEdits"]["deviceNodes"] = [node]
    return edited


def _with_env(spec: dict[str, Any], index: int, value: Any) -> dict[str, Any]:
    edited = json.loads(json.dumps(spec))
    env = edited["containerEdits"]["env"]
    env[index % len(env)] = value
    return edited


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(path="/dev/iluvatar" + "9" * 5000),
         r"devices\[0\]\.containerEdits\.deviceNodes: expected a list of /dev/iluvatar<N> nodes"),
        (lambda s: s["devices"].__setitem__(0, None), r"devices\[0\]\.name: expected uid-1-<device>, got null"),
        (lambda s: s["devices"][-1].__setitem__("containerEdits", []),
         r"devices\[record\]\.containerEdits: expected an object, got a list"),
        (lambda s: s["devices"][-1]["containerEdits"].__setitem__("env", [1]),
         r"devices\[record\]\.containerEdits\.env: expected a list of NAME=value"),
        (lambda s: (s["devices"].pop(), s.__setitem__("containerEdits", [])),  # an earlier driver's: no record
         r"^containerEdits: expected an object, got a list"),
        (lambda s: (s["devices"].pop(), s["containerEdits"].__setitem__("env", [1])),
         r"^containerEdits\.env: expected a list of NAME=value"),
        (lambda s: s.__setitem__("devices", s["devices"][-1:]), r"devices: expected a device besides the record"),
        (lambda s: s.__setitem__("devices", []), r"devices: expected a list of devices"),
        (lambda s: s.__setitem__("kind", "nvidia.com/gpu"), r"kind: expected gpu\.iluvatar\.com/claim"),
    ],
)  # fmt: skip
def test_a_malformed_claim_spec_is_refused_naming_the_field(edit: Any, message: str) -> None:
    spec = json.loads(json.dumps(a_checkpoint()["claims"]["uid-1"]["spec"]))
    edit(spec)
    with pytest.raises(SpecError, match=message):
        claim_from_spec("uid-1", spec, POOL)
