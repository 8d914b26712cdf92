"""The pure DRA cores: inventory -> slice devices, claim -> prepared devices, the checkpoint format; and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ix_device_plugin.cli import main
from ix_device_plugin.core.inventory import Board, ChipStatus, Inventory
from ix_device_plugin.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointTooNew,
    checkpoint_text,
    parse_checkpoint,
)
from ix_device_plugin.dra.claims import NodeView, prepare
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef, PreparedClaim
from ix_device_plugin.dra.slices import (
    PCIE_ROOT_ATTRIBUTE,
    device_body,
    semver,
    slice_content,
    slice_devices,
    taints_dropped,
)
from ix_device_plugin.hardware.pcie import pcie_root, pcie_roots
from ix_device_plugin.hardware.simulated import parse_spec

REF = ClaimRef("default", "claim", "uid-1")


def inventory(spec: str = "BI-V150:2", version: str = "4.1.0") -> Inventory:
    return Inventory(boards=parse_spec(spec), driver_version=version, control_nodes=("/dev/itrctl",))


def allocated_claim(*devices: str, uid: str = "uid-1", pool: str = "node-a") -> dict:
    results = [{"request": "gpu", "driver": "gpu.iluvatar.com", "pool": pool, "device": d} for d in devices]
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}}


def node_view(spec: str = "BI-V150:2", control_nodes: tuple[str, ...] = ()) -> NodeView:
    return NodeView(slice_content(inventory(spec)).by_name(), "node-a", control_nodes, Path("/"))


def prepared_for(claim: dict, ref: ClaimRef = REF, others: dict[str, PreparedClaim] | None = None) -> PreparedClaim:
    return prepare(ref, claim, node_view(), others or {})


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
    }
    assert body["capacity"] == {"memory": {"value": f"{device.chip.memory_mib}Mi"}}
    assert body["consumesCounters"] == [{"counterSet": "board-0", "counters": {"gpu-1": {"value": "1"}}}]


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


def test_the_checkpoint_round_trips_and_refuses_what_it_cannot_read() -> None:
    prepared = prepared_for(allocated_claim("gpu-1"))
    text = checkpoint_text({REF.uid: prepared}, "boot-1")
    assert parse_checkpoint(text, "cp") == Checkpoint("boot-1", {REF.uid: prepared})
    with pytest.raises(CheckpointError, match="cp: is not JSON"):
        parse_checkpoint(text[:20], "cp")
    with pytest.raises(CheckpointError, match="unsupported checkpoint version 0"):
        parse_checkpoint(json.dumps({"version": 0}), "cp")
    broken = json.loads(text)
    del broken["claims"][REF.uid]["devices"][0]["uuid"]
    with pytest.raises(CheckpointError, match=r"cp: claims\.uid-1\.devices\[0\]\.uuid: missing"):
        parse_checkpoint(json.dumps(broken), "cp")


def test_a_checkpoint_of_a_newer_version_is_refused_not_discarded() -> None:
    with pytest.raises(CheckpointTooNew, match="checkpoint version 9 was written by a newer driver"):
        parse_checkpoint(json.dumps({"version": 9, "claims": {}}), "cp")


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'{"version": 1, "claims": {"\xff": {}}}', "is not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested more than"),
        (b'{"version": 1, "claims": ' + b'{"a":' * 40 + b"1" + b"}" * 41, "nested more than 16 levels"),
    ],
)
def test_a_hostile_checkpoint_is_a_clear_error(data: bytes, why: str) -> None:
    with pytest.raises(CheckpointError, match=why):
        parse_checkpoint(data, "cp")


def test_fields_an_older_driver_does_not_know_are_ignored_and_new_ones_default() -> None:
    prepared = prepared_for(allocated_claim("gpu-1"))
    document = json.loads(checkpoint_text({REF.uid: prepared}))
    del document["bootID"]
    del document["claims"][REF.uid]["complete"]
    del document["claims"][REF.uid]["devices"][0]["admin"]
    document["claims"][REF.uid]["future"] = {"x": 1}
    assert parse_checkpoint(json.dumps(document), "cp") == Checkpoint("", {REF.uid: prepared})


def test_a_board_without_chips_gives_no_devices() -> None:
    assert slice_content(Inventory(boards=(Board("BI-V100", ()),))).devices == ()


def test_dra_needs_a_node_name(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["dra", "--backend", "simulated"]) == 2
    assert "dra needs the node name: give --node-name or NODE_NAME" in capsys.readouterr().err


def test_dra_without_api_server_settings_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["dra", "--backend", "simulated", "--node-name", "node-a"]) == 2
    assert "dra needs the Kubernetes API server" in capsys.readouterr().err


def test_list_dra_shows_the_slice_and_the_prepared_claims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prepared = prepared_for(allocated_claim("gpu-1"))
    directory = tmp_path / "plugins" / "gpu.iluvatar.com"
    directory.mkdir(parents=True)
    (directory / "checkpoint.json").write_text(checkpoint_text({REF.uid: prepared}))
    argv = ["list", "--dra", "--backend", "simulated", "--node-name", "node-a", "--dev-root", str(tmp_path)]
    argv += ["--kubelet-plugins-directory-path", str(tmp_path / "plugins")]
    assert main([*argv, "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resourceSlice"] == "node-a-gpu.iluvatar.com"
    assert report["preparedClaims"]["uid-1"]["claim"] == "default/claim"
    assert report["preparedClaims"]["uid-1"]["devices"] == ["gpu-1"]
    assert [d["name"] for d in report["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "board-0", "board-2"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "gpu-3: chip" in text and "board-2: board" in text and "default/claim (uid-1): gpu-1" in text
    assert "gpu-1: chip" in text and "held by default/claim" in text
