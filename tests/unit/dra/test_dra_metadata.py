"""Device metadata: where a container finds it, what it says, the format (checked by the reference Go reader), and
the files the driver keeps of it (written, kept when nothing changed, next generation on a change, removed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.metadata_reader import read_with_reference, reference_reader
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core.inventory import ChipStatus, Inventory
from ix_device_plugin.dra.checkpoint import CheckpointError, checkpoint_text, parse_checkpoint
from ix_device_plugin.dra.claims import NodeView, prepare
from ix_device_plugin.dra.metadata import (
    NodeFacts,
    cdi_spec,
    claim_dir,
    container_path,
    generation_of,
    host_path,
    named_claim_dir,
    request_files,
    stream_text,
    uid_of,
)
from ix_device_plugin.dra.metadatafiles import MetadataFiles, with_generations
from ix_device_plugin.dra.prepared import ClaimError, ClaimRef, PreparedClaim
from ix_device_plugin.dra.slices import SlicePolicy, device_body, slice_content
from ix_device_plugin.hardware.simulated import parse_spec

REF = ClaimRef("team-a", "train", "0b5e6f1c-4d3a-4b8e-9f21-7c6d5e4f3a2b")
SHARE = "6d0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
POD_CLAIM = "resource.kubernetes.io/pod-claim-name"


def inventory(spec: str = "BI-V150:2", numa: int | None = 1) -> Inventory:
    boards = parse_spec(spec)
    boards = tuple(replace(b, chips=tuple(replace(c, numa_node=numa) for c in b.chips)) for b in boards)
    return Inventory(boards=boards, driver_version="4.1.0", control_nodes=("/dev/itrctl",))


WHOLE = SlicePolicy()


def facts(spec: str = "BI-V150:2", policy: SlicePolicy = WHOLE, numa: int | None = 1) -> NodeFacts:
    inv = inventory(spec, numa)
    roots = {chip.bus_id: "pci0000:00" for chip in inv.chips()}
    return NodeFacts(slice_content(inv, policy=policy), roots)


def claim(*results: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    listed = [{"driver": "gpu.iluvatar.com", "pool": "node-a", "request": "gpu", **r} for r in results]
    metadata: dict[str, Any] = {"uid": REF.uid, "annotations": annotations or {}}
    return {"metadata": metadata, "status": {"allocation": {"devices": {"results": listed}}}}


def prepared(node: NodeFacts, *results: dict[str, Any], annotations: dict[str, str] | None = None) -> PreparedClaim:
    view = NodeView(node.content.by_name(), "node-a", (), Path("/"))
    return prepare(REF, claim(*results, annotations=annotations), view, {})


# ---- where, and what ---------------------------------------------------------------------------------------


def test_a_claim_named_by_the_pod_and_one_made_from_a_template_are_found_where_kubernetes_says() -> None:
    assert container_path(REF, None, "gpu") == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/gpu/gpu.iluvatar.com-metadata.json"
    )
    assert container_path(REF, "gpus", "gpu") == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.iluvatar.com-metadata.json"
    )
    assert host_path(Path("/d"), REF.uid, "gpu") == Path(f"/d/dra-device-metadata/{REF.uid}/gpu/metadata.json")


def test_the_cdi_spec_mounts_the_file_read_only_where_the_container_looks() -> None:
    node = facts()
    claimed = prepared(node, {"device": "gpu-0"}, annotations={POD_CLAIM: "gpus"})
    spec = cdi_spec(claimed, "gpu", Path("/d"))
    assert spec["kind"] == "gpu.iluvatar.com/metadata"
    (device,) = spec["devices"]
    assert device == {
        "name": f"{REF.uid}_gpu",
        "containerEdits": {
            "mounts": [
                {
                    "hostPath": f"/d/dra-device-metadata/{REF.uid}/gpu/metadata.json",
                    "containerPath": container_path(REF, "gpus", "gpu"),
                    "options": ["ro", "bind"],
                }
            ]
        },
    }
    assert claimed.devices[0].cdi_ids[-1] == f"gpu.iluvatar.com/metadata={REF.uid}_gpu"


def test_every_attribute_the_slice_publishes_is_in_the_metadata_with_what_only_the_node_knows() -> None:
    node = facts()
    claimed = prepared(node, {"device": "gpu-1"}, {"device": "board-2", "request": "board"})
    files = {f.request: f.document for f in request_files(claimed, node)}
    assert sorted(files) == ["board", "gpu"]
    (chip,) = files["gpu"]["requests"][0]["devices"]
    published = device_body(node.content.by_name()["gpu-1"], "4.1.0", node.roots)["attributes"]
    extra = {key: value for key, value in chip["attributes"].items() if key not in published}
    assert {key: chip["attributes"][key] for key in published} == published
    uuid = published["uuid"]["string"]
    assert extra == {
        "deviceNodes": {"strings": ["/dev/iluvatar1"]},
        "healthy": {"bool": True},
        "visibleDevices": {"strings": [uuid]},
    }
    assert chip["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 1}
    (board,) = files["board"]["requests"][0]["devices"]
    assert board["attributes"]["deviceNodes"] == {"strings": ["/dev/iluvatar2", "/dev/iluvatar3"]}
    assert len(board["attributes"]["visibleDevices"]["strings"]) == 2
    assert list(chip["attributes"]) == sorted(chip["attributes"])  # as Go writes a map


def test_a_share_says_its_share_id_and_amount_and_an_admin_claim_says_so() -> None:
    node = facts(policy=SlicePolicy(splitboard=True, replicas=4))
    share = {"device": "gpu-0", "shareID": SHARE, "consumedCapacity": {"shares": "2"}}
    claimed = prepared(node, share, {"device": "gpu-1", "request": "watch", "adminAccess": True})
    files = {f.request: f.document for f in request_files(claimed, node)}
    attributes = files["gpu"]["requests"][0]["devices"][0]["attributes"]
    uuid = attributes["uuid"]["string"]
    assert attributes["shareID"] == {"string": SHARE}
    assert attributes["shares"] == {"int": 2}
    assert attributes["replicaDevices"] == {"strings": [f"{uuid}::0", f"{uuid}::1"]}
    assert files["watch"]["requests"][0]["devices"][0]["attributes"]["adminAccess"] == {"bool": True}


def test_a_first_available_request_is_filed_under_its_request_and_names_the_subrequest() -> None:
    node = facts()
    claimed = prepared(node, {"device": "gpu-0", "request": "gpu/large"}, {"device": "gpu-1", "request": "gpu/large"})
    (entry,) = request_files(claimed, node)
    assert entry.request == "gpu"
    (request,) = entry.document["requests"]
    assert request["name"] == "gpu/large"
    assert [d["name"] for d in request["devices"]] == ["gpu-0", "gpu-1"]
    assert claimed.devices[0].cdi_ids[-1].endswith("_gpu") and len(claimed.devices[1].cdi_ids) == 1


def test_no_numa_affinity_publishes_no_numa_node() -> None:
    node = facts(numa=None)
    attributes = device_body(node.content.by_name()["gpu-0"], "4.1.0", node.roots)["attributes"]
    assert "numaNode" not in attributes and "resource.kubernetes.io/numaNode" not in attributes
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:10:00.0"}


@pytest.mark.parametrize(
    ("results", "annotations", "why"),
    [
        ([{"device": "gpu-0", "request": "GPU"}], None, "request 'GPU' is not a DNS label"),
        ([{"device": "gpu-0"}], {POD_CLAIM: "../x"}, "pod-claim-name '../x' is not a DNS label"),
    ],
)
def test_names_that_would_leave_their_directory_fail_the_claim(results: list, annotations: Any, why: str) -> None:
    with pytest.raises(ClaimError, match=why.replace(".", r"\.")):
        prepared(facts(), *results, annotations=annotations)


def test_the_checkpoint_keeps_the_pod_claim_name_and_refuses_one_that_is_not_a_label() -> None:
    node = facts()
    claimed = prepared(node, {"device": "gpu-0"}, annotations={POD_CLAIM: "gpus"})
    text = checkpoint_text({REF.uid: claimed})
    assert parse_checkpoint(text, "cp").claims[REF.uid].pod_claim == "gpus"
    with pytest.raises(CheckpointError, match=r"podClaimName: '\.\./x' is not a DNS label"):
        parse_checkpoint(text.replace('"gpus"', '"../x"'), "cp")


def test_the_checkpoint_keeps_the_generations_in_version_1_and_reads_one_without_them() -> None:
    claimed = replace(prepared(facts(), {"device": "gpu-0"}), metadata_generations={"gpu": 7})
    document = json.loads(checkpoint_text({REF.uid: claimed}))
    assert document["version"] == 1 and document["claims"][REF.uid]["metadataGenerations"] == {"gpu": 7}
    assert parse_checkpoint(json.dumps(document), "cp").claims[REF.uid].metadata_generations == {"gpu": 7}
    del document["claims"][REF.uid]["metadataGenerations"]  # as a driver before them wrote it
    assert parse_checkpoint(json.dumps(document), "cp").claims[REF.uid].metadata_generations == {}
    document["claims"][REF.uid]["aFieldOfANewerDriver"] = {"any": [1]}  # how an older driver reads ours
    assert parse_checkpoint(json.dumps(document), "cp").claims[REF.uid] == replace(claimed, metadata_generations={})


# ---- the format ---------------------------------------------------------------------------------------------


def test_the_stream_holds_v1beta1_then_v1alpha1_as_go_indents_them() -> None:
    node = facts()
    claimed = prepared(node, {"device": "gpu-0"}, annotations={POD_CLAIM: "gpus"})
    (entry,) = request_files(claimed, node)
    text = stream_text(entry.document, 7)
    first, second = (json.loads(part) for part in text.replace("}\n{", "}\n\x00{").split("\x00"))
    assert [first["apiVersion"], second["apiVersion"]] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    assert list(first) == ["kind", "apiVersion", "metadata", "podClaimName", "requests"]
    assert first["metadata"] == {"name": "train", "namespace": "team-a", "uid": REF.uid, "generation": 7}
    assert text.startswith('{\n  "kind": "DeviceMetadata",\n  "apiVersion": "metadata.resource.k8s.io/v1beta1",\n')
    assert text.endswith("}\n") and text.count("\n}\n") == 2
    assert generation_of(text) == 7


def test_strings_are_escaped_as_go_escapes_them() -> None:
    document = {"metadata": {"name": "c", "namespace": "n", "uid": "u"}, "requests": [{"name": "a<b>&c\u2028é"}]}
    assert '"name": "a\\u003cb\\u003e\\u0026c\\u2028é"' in stream_text(document, 1)


def test_the_reference_reader_decodes_every_kind_of_claim_byte_for_byte(tmp_path: Path) -> None:
    binary = reference_reader()
    shared = facts(policy=SlicePolicy(splitboard=True, replicas=4))
    node = facts()
    cases = {
        "chip": (node, [{"device": "gpu-0"}], None),
        "board-template": (node, [{"device": "board-0"}], {POD_CLAIM: "gpus"}),
        "first-available": (node, [{"device": "gpu-1", "request": "gpu/small"}], None),
        "admin": (node, [{"device": "gpu-2", "adminAccess": True}], None),
        "share": (shared, [{"device": "gpu-3", "shareID": SHARE, "consumedCapacity": {"shares": "1"}}], None),
        "two-requests": (node, [{"device": "gpu-0"}, {"device": "gpu-1", "request": "more"}], None),
        "no-numa": (facts(numa=None), [{"device": "gpu-0"}], None),
    }
    files, expected = [], []
    for name, (node_facts, results, annotated) in cases.items():
        for entry in request_files(prepared(node_facts, *results, annotations=annotated), node_facts):
            path = tmp_path / f"{name}-{entry.request}.json"
            path.write_text(stream_text(entry.document, 3))
            files.append(path)
            expected.append(entry.document)
    decoded = read_with_reference(binary, files)
    for document, read in zip(expected, decoded, strict=True):
        assert read["versions"] == ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
        assert read["metadata"]["requests"] == document["requests"]
        assert read["metadata"].get("podClaimName") == document.get("podClaimName")
        assert read["metadata"]["metadata"]["generation"] == 3


# ---- the files ----------------------------------------------------------------------------------------------


def write(files: MetadataFiles, claim: PreparedClaim, node: NodeFacts) -> tuple[PreparedClaim, int]:
    """What the state does: the changes, their generations recorded in the claim, then the files."""
    changes = files.changes(claim, node)
    claim = with_generations(claim, changes)
    return claim, files.write(claim, changes)


def test_files_are_written_kept_when_unchanged_updated_in_place_and_removed(tmp_path: Path) -> None:
    files = MetadataFiles(tmp_path / "driver", tmp_path / "cdi")
    node = facts()
    claimed, written = write(files, prepared(node, {"device": "gpu-0"}), node)
    assert written == 1 and claimed.metadata_generations == {"gpu": 1}
    path = host_path(tmp_path / "driver", REF.uid, "gpu")
    spec = tmp_path / "cdi" / f"gpu.iluvatar.com_metadata_{REF.uid}_gpu.json"
    first, inode = path.read_text(), path.stat().st_ino
    assert generation_of(first) == 1 and spec.is_file()
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert files.changes(claimed, node) == []  # a restart, a second prepare: nothing changed
    assert path.read_text() == first
    first_chip = next(iter(inventory().chips()))
    sick = inventory().with_statuses({first_chip.uuid: ChipStatus(errors=frozenset({"ECC"}))})
    changed = NodeFacts(slice_content(sick), node.roots)
    claimed, written = write(files, claimed, changed)
    assert written == 1 and claimed.metadata_generations == {"gpu": 2}
    assert generation_of(path.read_text()) == 2 and path.stat().st_ino == inode  # the container's mount sees it
    assert '"bool": false' in path.read_text()
    assert files.changes(claimed, NodeFacts(known=False)) == []  # before the first discovery: kept as it is
    files.remove(REF.uid)
    assert not path.exists() and not path.parent.parent.exists() and not spec.exists()


def test_a_file_found_torn_or_behind_gets_the_generation_after_the_last_one_given(tmp_path: Path) -> None:
    files = MetadataFiles(tmp_path / "driver", tmp_path / "cdi")
    node = facts()
    claimed, _ = write(files, replace(prepared(node, {"device": "gpu-0"}), metadata_generations={"gpu": 2}), node)
    path = host_path(tmp_path / "driver", REF.uid, "gpu")
    assert generation_of(path.read_text()) == 3  # a claim rebuilt from its spec keeps counting
    path.write_text(path.read_text()[:100])  # a write cut short
    claimed, _ = write(files, claimed, node)
    assert generation_of(path.read_text()) == 4 and claimed.metadata_generations == {"gpu": 4}
    (change,) = files.changes(replace(claimed, metadata_generations={"gpu": 9}), NodeFacts(known=True))
    assert change.generation == 10  # the checkpoint says more than the file (a write that failed): after it
    (change,) = files.changes(replace(claimed, metadata_generations={}), NodeFacts(known=True))
    assert change.generation == 5  # an older driver's checkpoint, without generations: after the file's


def test_two_claims_of_one_name_have_their_own_files_and_either_goes_alone(tmp_path: Path) -> None:
    files = MetadataFiles(tmp_path / "driver", tmp_path / "cdi")
    node = facts()
    write(files, prepared(node, {"device": "gpu-0"}), node)
    again = ClaimRef(REF.namespace, REF.name, "9f1e2d3c-0000-4000-8000-000000000001")
    write(files, replace(prepared(node, {"device": "gpu-1"}), ref=again), node)
    root = tmp_path / "driver"
    old_path, new_path = host_path(root, REF.uid, "gpu"), host_path(root, again.uid, "gpu")
    assert mounted(tmp_path, again) == str(new_path) and mounted(tmp_path, REF) == str(old_path)
    files.remove(REF.uid)
    assert not old_path.exists() and '"gpu-1"' in new_path.read_text()
    assert mounted(tmp_path, again) == str(new_path)


def mounted(tmp_path: Path, ref: ClaimRef) -> str:
    """The host file the claim's metadata CDI spec mounts."""
    spec = json.loads((tmp_path / "cdi" / f"gpu.iluvatar.com_metadata_{ref.uid}_gpu.json").read_text())
    return str(spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"])


def test_orphans_go_at_start_and_while_a_claim_is_rebuilt_without_its_name_the_files_by_name_stay(
    tmp_path: Path,
) -> None:
    files = MetadataFiles(tmp_path / "driver", tmp_path / "cdi")
    node = facts()
    claimed, _ = write(files, prepared(node, {"device": "gpu-0"}), node)
    named = named_claim_dir(tmp_path / "driver", REF) / "gpu"
    named.mkdir(parents=True)
    (named / "metadata.json").write_text("{}")
    incomplete = replace(claimed, ref=ClaimRef("", "", "other-uid"), complete=False)
    files.remove_orphans({"other-uid": incomplete, REF.uid: claimed})
    assert host_path(tmp_path / "driver", REF.uid, "gpu").exists() and named.exists()  # its spec may mount it
    files.remove_orphans({"other-uid": incomplete})
    assert not host_path(tmp_path / "driver", REF.uid, "gpu").exists() and named.exists()
    assert not list((tmp_path / "cdi").iterdir())  # the spec of a claim the checkpoint lacks
    files.remove_orphans({})
    assert not list((tmp_path / "driver" / "dra-device-metadata").iterdir())


def test_a_file_by_name_is_carried_over_as_the_same_inode_to_the_claim_it_names(tmp_path: Path) -> None:
    root = tmp_path / "driver"
    files = MetadataFiles(root, tmp_path / "cdi")
    node = facts()
    claimed = prepared(node, {"device": "gpu-0"})
    (entry,) = request_files(claimed, node)
    named = named_claim_dir(root, REF) / "gpu" / "metadata.json"
    named.parent.mkdir(parents=True)
    named.write_text(stream_text(entry.document, 4))
    again = replace(claimed, ref=ClaimRef(REF.namespace, REF.name, "9f1e2d3c-0000-4000-8000-000000000001"))
    files.adopt_named({REF.uid: claimed, again.ref.uid: again})  # two of that name: the one the file names
    carried = host_path(root, REF.uid, "gpu")
    assert carried.stat().st_ino == named.stat().st_ino and not claim_dir(root, again.ref.uid).exists()
    assert files.changes(claimed, node) == []  # the same text: not written again, its generation goes on
    files.write_specs(claimed)
    files.remove_orphans({REF.uid: claimed, again.ref.uid: again})
    assert not named.parent.parent.exists() and generation_of(carried.read_text()) == 4


def test_a_torn_file_by_name_goes_to_the_one_claim_of_that_name_and_to_none_of_two(tmp_path: Path) -> None:
    root = tmp_path / "driver"
    files = MetadataFiles(root, tmp_path / "cdi")
    claimed = prepared(facts(), {"device": "gpu-0"})
    named = named_claim_dir(root, REF) / "gpu" / "metadata.json"
    named.parent.mkdir(parents=True)
    named.write_text('{"kind": "Devi')
    again = replace(claimed, ref=ClaimRef(REF.namespace, REF.name, "9f1e2d3c-0000-4000-8000-000000000001"))
    files.adopt_named({REF.uid: claimed, again.ref.uid: again})
    assert not (root / "dra-device-metadata" / REF.uid).exists()
    files.adopt_named({REF.uid: claimed})
    assert host_path(root, REF.uid, "gpu").stat().st_ino == named.stat().st_ino


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(st.binary(max_size=300), JSON, st.integers(min_value=0, max_value=200_000))
def test_any_text_in_a_metadata_file_has_a_generation_and_a_uid_or_none(data: bytes, value: Any, depth: int) -> None:
    """What another writer leaves in the file (bytes, any document, in `metadata` or nested past any limit)."""
    texts = [
        data.decode("utf-8", "replace"),
        json.dumps(value),
        json.dumps({"metadata": value}),
        json.dumps({"metadata": {"generation": value, "uid": value}}),
        "[" * depth,
        '{"metadata": ' * depth,
    ]
    for text in texts:
        generation, uid = generation_of(text), uid_of(text)
        assert generation is None or (type(generation) is int and 1 <= generation < 2**63 - 1)
        assert uid is None or isinstance(uid, str)
