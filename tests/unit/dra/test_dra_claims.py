"""Preparing claims for boards, chips and shares, and the per-claim GpuConfig: the pure cores."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from ix_device_plugin.cli import main
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.dra.checkpoint import checkpoint_text, parse_checkpoint
from ix_device_plugin.dra.claims import NodeView, prepare
from ix_device_plugin.dra.claimspec import SpecError, claim_from_spec
from ix_device_plugin.dra.claimstatus import device_entries
from ix_device_plugin.dra.config import GpuConfig
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef, PreparedClaim
from ix_device_plugin.dra.slices import SlicePolicy, slice_content
from ix_device_plugin.hardware.simulated import parse_spec

POOL = "node-a"


EXCLUSIVE = SlicePolicy()


def node(spec: str = "BI-V150:2", policy: SlicePolicy = EXCLUSIVE) -> NodeView:
    inventory = Inventory(boards=parse_spec(spec), control_nodes=("/dev/itrctl",))
    return NodeView(slice_content(inventory, policy=policy).by_name(), POOL, ("/dev/itrctl",), Path("/"))


def gpu_config(source: str = "FromClaim", requests: tuple[str, ...] = (), **fields: Any) -> dict[str, Any]:
    parameters = {"apiVersion": "gpu.iluvatar.com/v1alpha1", "kind": "GpuConfig", **fields}
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": "gpu.iluvatar.com", "parameters": parameters}}
    return {**entry, "requests": list(requests)} if requests else entry


def claim(uid: str, *devices: str, shares: int | None = None, config: list[dict[str, Any]] | None = None) -> dict:
    results = []
    for device in devices:
        result: dict[str, Any] = {"request": "gpu", "driver": "gpu.iluvatar.com", "pool": POOL, "device": device}
        if shares is not None:
            result.update(shareID=str(uuid.uuid4()), consumedCapacity={"shares": str(shares)})
        results.append(result)
    allocation = {"devices": {"results": results, "config": config or []}}
    return {"metadata": {"uid": uid}, "status": {"allocation": allocation}}


def prepared(uid: str, *devices: str, view: NodeView | None = None, others: dict | None = None, **kw: Any):
    return prepare(ClaimRef("default", uid, uid), claim(uid, *devices, **kw), view or node(), others or {})


def test_a_board_claim_gives_the_container_every_chip_of_the_board() -> None:
    view = node()
    board = prepared("b", "board-2", view=view)
    (device,) = board.devices
    chips = [view.devices["gpu-2"].chip.uuid, view.devices["gpu-3"].chip.uuid]
    assert (device.kind, device.chip_uuids, device.uuid) == ("board", tuple(chips), chips[0])
    entry, record = board.spec["devices"]
    assert (entry["name"], record["name"]) == ("b-board-2", "b-record")
    assert [n["path"] for n in entry["containerEdits"]["deviceNodes"]] == ["/dev/iluvatar2", "/dev/iluvatar3"]
    env = board.spec["containerEdits"]["env"]
    assert f"IX_VISIBLE_DEVICES={','.join(chips)}" in env and f"IX_REPLICA_DEVICES={chips[0]}" in env


def test_a_board_and_one_of_its_chips_never_go_to_two_claims() -> None:
    board = prepared("b", "board-0")
    with pytest.raises(ClaimError, match=r"device gpu-1 \(.*\) is prepared for claim default/b \(uid b\) as part of"):
        prepared("c", "gpu-1", others={"b": board})
    chip = prepared("c", "gpu-1")
    with pytest.raises(ClaimError, match=r"device board-0 .* is prepared for claim default/c"):
        prepared("b", "board-0", others={"c": chip})
    assert prepared("c", "gpu-2", others={"b": board}).uuids  # the other board's chips are free


def test_four_shares_of_a_chip_each_get_a_slot_and_a_fifth_is_refused() -> None:
    view = node(policy=SlicePolicy(splitboard=True, replicas=4))
    others: dict[str, PreparedClaim] = {}
    for index in range(4):
        share = prepared(f"s{index}", "gpu-0", view=view, others=others, shares=1)
        others[f"s{index}"] = share
        (device,) = share.devices
        assert device.slots == (index,) and device.shares == 1 and device.share_id
        assert share.spec["devices"][0]["name"] == f"s{index}-gpu-0-{device.share_id}"
        uuid0 = view.devices["gpu-0"].chip.uuid
        assert f"IX_REPLICA_DEVICES={uuid0}::{index}" in share.spec["containerEdits"]["env"]
    with pytest.raises(ClaimError, match=r"gpu-0 has 4 shares: 4 are prepared for .*, this claim asks for 1"):
        prepared("s4", "gpu-0", view=view, others=others, shares=1)
    del others["s1"]
    assert prepared("s4", "gpu-0", view=view, others=others, shares=1).devices[0].slots == (1,)
    with pytest.raises(ClaimError, match=r"gpu-0 .* is prepared for claim"):  # held whole while shared: refused
        prepared("whole", "gpu-0", view=view, others=others)


def test_a_claim_asking_for_more_shares_takes_as_many_slots() -> None:
    view = node("BI-V100:1", SlicePolicy(replicas=4))
    two = prepared("two", "gpu-0", view=view, shares=2)
    assert two.devices[0].slots == (0, 1)
    uuid0 = view.devices["gpu-0"].chip.uuid
    assert f"IX_REPLICA_DEVICES={uuid0}::0,{uuid0}::1" in two.spec["containerEdits"]["env"]
    with pytest.raises(ClaimError, match="this claim asks for 3"):
        prepared("three", "gpu-0", view=view, others={"two": two}, shares=3)


def test_a_share_of_a_device_that_is_no_longer_shared_is_refused() -> None:
    with pytest.raises(ClaimError, match="allocated as a share, but it is not shared on this node"):
        prepared("s", "gpu-0", shares=1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([gpu_config(resets=True)], r"parameters\.resets: unknown field \(GpuConfig has apiVersion"),
        ([gpu_config(reset="yes")], r"parameters\.reset: expected true or false, got 'yes'"),
        ([gpu_config(sharing={"shares": "two"})], r"parameters\.sharing\.shares: expected an integer from 1"),
        ([gpu_config(sharing={"replicas": 2})], r"parameters\.sharing\.replicas: unknown field"),
        ([gpu_config(sharing=[1])], r"parameters\.sharing: expected an object with shares, got a list"),
        ([gpu_config(apiVersion="gpu.iluvatar.com/v1")], r"parameters\.apiVersion: expected gpu.iluvatar.com/v1alpha1"),
        ([gpu_config(kind="Other")], r"parameters\.kind: expected GpuConfig, got 'Other'"),
        ([{**gpu_config(), "source": "FromSomewhere"}], r"source: expected FromClass or FromClaim"),
        ([{"source": "FromClaim", "opaque": {"driver": "gpu.iluvatar.com", "parameters": 3}}], "parameters: expected"),
    ],
)
def test_a_config_that_is_not_a_gpuconfig_fails_the_claim_naming_the_field(config: list, message: str) -> None:
    where = r"claim default/c \(uid c\): status\.allocation\.devices\.config\[0\]\.(opaque\.)?"
    with pytest.raises(ClaimError, match=where + message):
        prepared("c", "gpu-0", config=config)


def test_other_drivers_configs_are_ignored_and_the_claims_config_wins_over_the_class() -> None:
    foreign = {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": {"anything": 1}}}
    assert prepared("c", "gpu-0", config=[foreign]).devices[0].config == GpuConfig()
    config = [gpu_config("FromClaim", reset=False), gpu_config("FromClass", reset=True, sharing={"shares": 1})]
    view = node("BI-V100:1", SlicePolicy(replicas=2))
    merged = prepared("c", "gpu-0", view=view, config=config, shares=1).devices[0].config
    assert merged == GpuConfig(reset=False, shares=1)  # the claim's reset, the class's sharing
    other_request = [gpu_config(requests=("other",), reset=True)]
    assert prepared("c", "gpu-0", config=other_request).devices[0].config == GpuConfig()
    subrequest = claim("c", "gpu-0", config=[gpu_config(requests=("gpu",), reset=True)])
    subrequest["status"]["allocation"]["devices"]["results"][0]["request"] = "gpu/small"
    chosen = prepare(ClaimRef("default", "c", "c"), subrequest, node(), {})
    assert chosen.devices[0].config.resets and chosen.reset_chips == chosen.uuids


def test_sharing_in_the_config_must_match_what_was_allocated() -> None:
    view = node("BI-V100:1", SlicePolicy(replicas=4))
    config = [gpu_config(sharing={"shares": 2})]
    assert prepared("c", "gpu-0", view=view, shares=2, config=config).devices[0].shares == 2
    with pytest.raises(ClaimError, match=r"sharing\.shares is 2, but gpu-0 was allocated with 1 shares: .*shares: 2"):
        prepared("c", "gpu-0", view=view, shares=1, config=config)
    with pytest.raises(ClaimError, match=r"sharing.shares: device gpu-0 is not shared on this node"):
        prepared("c", "gpu-0", view=node("BI-V100:1"), config=config)


def test_a_reset_is_refused_on_a_chip_shared_with_another_claim() -> None:
    view = node("BI-V100:1", SlicePolicy(replicas=4))
    first = prepared("a", "gpu-0", view=view, shares=1)
    with pytest.raises(ClaimError, match=r"reset: gpu-0 is shared with default/a .*would stop their containers"):
        prepared("b", "gpu-0", view=view, others={"a": first}, shares=1, config=[gpu_config(reset=True)])
    alone = prepared("b", "gpu-0", view=view, shares=1, config=[gpu_config(reset=True)])
    assert alone.reset_chips == (view.devices["gpu-0"].chip.uuid,)


def test_the_checkpoint_keeps_boards_shares_and_config_and_reads_old_entries() -> None:
    view = node(policy=SlicePolicy(True, 4))
    share = prepared("s", "gpu-1", view=view, shares=2, config=[gpu_config(reset=True)])
    board = prepared("b", "board-2")
    text = checkpoint_text({"s": share, "b": board}, "boot")
    assert parse_checkpoint(text, "cp").claims == {"s": share, "b": board}
    document = json.loads(text)
    entry = document["claims"]["s"]["devices"][0]
    for added in ("share_id", "shares", "slots", "chips", "kind"):
        del entry[added]
    entry["config"] = {"reset": "yes", "future": 1}  # read leniently: what is not understood is unset
    (old,) = parse_checkpoint(json.dumps(document), "cp").claims["s"].devices
    assert (old.share_id, old.shares, old.slots, old.kind, old.config) == ("", 0, (), "chip", GpuConfig())


def test_a_claim_is_rebuilt_from_its_spec_with_its_boards_and_shares() -> None:
    view = node(policy=SlicePolicy(True, 4))
    share = prepared("s", "gpu-1", view=view, shares=2)
    rebuilt = claim_from_spec("s", share.spec, POOL)
    assert rebuilt is not None and not rebuilt.complete
    (device,) = rebuilt.devices
    original = share.devices[0]
    assert (device.device, device.share_id, device.slots, device.shares) == (
        "gpu-1", original.share_id, original.slots, original.shares
    )  # fmt: skip
    board = prepared("b", "board-0")
    (device,) = claim_from_spec("b", board.spec, POOL).devices  # type: ignore[union-attr]
    assert (device.kind, device.chip_uuids) == ("board", board.devices[0].chip_uuids)
    with pytest.raises(SpecError, match=r"devices\[0\]\.name: expected other-<device>, got 'b-board-0'"):
        claim_from_spec("other", board.spec, POOL)


def test_a_claim_rebuilt_from_its_spec_keeps_which_devices_were_given_with_admin_access() -> None:
    view = node(policy=SlicePolicy(True, 4))
    watched = claim("m", "gpu-0", "gpu-1", shares=1)
    watched["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    monitor = prepare(ClaimRef("default", "m", "m"), watched, view, {})
    assert [d.admin for d in monitor.devices] == [True, False]
    (record,) = [d for d in monitor.spec["devices"] if d["name"] == "m-record"]
    assert f"IX_DRA_ADMIN_ACCESS=gpu-0-{monitor.devices[0].share_id}" in record["containerEdits"]["env"]
    rebuilt = claim_from_spec("m", monitor.spec, POOL)
    assert [(d.device, d.admin, d.slots) for d in rebuilt.devices] == [("gpu-0", True, ()), ("gpu-1", False, (0,))]
    whole = prepared("w", "gpu-2")  # no admin access: the record says nothing of it
    assert "IX_DRA_ADMIN_ACCESS" not in json.dumps(whole.spec)
    assert [d.admin for d in claim_from_spec("w", whole.spec, POOL).devices] == [False]


def test_the_claim_status_names_a_boards_chips_and_a_shares_id_and_slots() -> None:
    view = node(policy=SlicePolicy(True, 4))
    share = prepared("s", "gpu-1", view=view, shares=2)
    uuid1 = view.devices["gpu-1"].chip.uuid
    (entry,) = device_entries(share, {uuid1: "0000:10:00.1"})
    assert entry == {
        "driver": "gpu.iluvatar.com", "pool": POOL, "device": "gpu-1", "shareID": share.devices[0].share_id,
        "data": {"uuid": uuid1, "pciBusID": "0000:10:00.1", "slots": [0, 1]},
    }  # fmt: skip
    board = prepared("b", "board-2")
    (entry,) = device_entries(board, {})
    chips = [{"uuid": uuid} for uuid in board.devices[0].chip_uuids]
    assert entry["data"] == {"boardUUID": board.devices[0].uuid, "chips": chips} and "shareID" not in entry


def test_list_dra_says_which_claim_holds_each_board_chip_and_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ix-config"
    config.write_text("flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 4\n")
    view = node(policy=SlicePolicy(True, 4))
    share = prepared("s", "gpu-1", view=view, shares=2, config=[gpu_config(reset=True)])
    board = prepared("b", "board-2")  # prepared before the node shared its chips
    directory = tmp_path / "plugins" / "gpu.iluvatar.com"
    directory.mkdir(parents=True)
    (directory / "checkpoint.json").write_text(checkpoint_text({"s": share, "b": board}))
    argv = ["list", "--dra", "--backend", "simulated", "--node-name", POOL, "--config", str(config)]
    argv += ["--kubelet-plugins-directory-path", str(tmp_path / "plugins")]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "4 shares per device" in text and "gpu-1: chip" in text and "shares held by default/s (2)" in text
    assert "held by default/b (as board-2)" in text  # on gpu-2 and gpu-3
    assert "default/s (s): gpu-1 (share" in text and "[reset: true]" in text
    assert main([*argv, "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (held,) = report["preparedClaims"]["s"]["held"]
    assert (held["shares"], held["slots"], held["config"]) == (2, [0, 1], "reset: true")
    assert report["preparedClaims"]["b"]["held"][0]["type"] == "board"
