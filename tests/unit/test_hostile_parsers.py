"""Every parser of something another process or tenant can write, fed arbitrary bytes, arbitrary nested values and
nests deeper than any parser goes: each returns a value or raises its own named error, never anything else.

The inputs and their writers: the node-health record and the healing story (any process with write access to the
kubelet's directories), the DRA checkpoint, claim specs and metadata files (the same; a metadata file is also mounted
into the claim's containers), the reset handshake's ConfigMap (ix-exporter, anyone with ConfigMap access), Volcano's
device ConfigMap and annotations (anyone who can edit them), the per-node config label (whoever labels the Node), the
kubelet's version (the Node's status), the boot id and sysfs files (the host), and API objects (the API server).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ix_device_plugin.apiserver.objects import config_map_doc, labels_of, pod_doc, uid_of, version_of
from ix_device_plugin.core.healthrecord import ChipRecord, HealthRecord, RecordError, parse_record, record_text
from ix_device_plugin.deviceplugin.features.volcano import (
    DEV_REAL_ALLOC,
    DEV_VOLCANO,
    PREDICATE_TIME,
    TAKEN,
    allocated_devices,
    allocation_annotations,
    clashes,
    held_devices,
    oldest_waiting,
    predicate_time,
    stored_content,
    waiting_for,
)
from ix_device_plugin.deviceplugin.features.volcanotrust import Trust
from ix_device_plugin.deviceplugin.handover import node_kubelet_version
from ix_device_plugin.dra.checkpoint import CheckpointError, parse_checkpoint, read_checkpoint
from ix_device_plugin.dra.claimspec import SpecError, claim_from_spec
from ix_device_plugin.dra.metadata import generation_of
from ix_device_plugin.gpureset.document import GpuResetError, ResetInfo
from ix_device_plugin.hardware.ixml.devices import read_numa_node
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.healing.story import read_story, story_line
from ix_device_plugin.kubelet.endpoints import keeps_several_endpoints, register_beside
from ix_device_plugin.nodelabels.featurefile import read_machine_name
from ix_device_plugin.runtime.files import read_boot_id
from ix_device_plugin.settings.documents import DocumentError, load_json, load_yaml
from ix_device_plugin.settings.options import Options, config_file_for

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["", "1", "v1.37.0", "true", "operator", "GPU-a", "ix-device-plugin/node-health"])
)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)
OPENERS = st.sampled_from(["[", '{"a": ', '{"kind": ', "- ", "{a: ", "[{"])


@st.composite
def nests(draw: st.DrawFn) -> bytes:
    """A nest of one opener, from a few levels to far past the recursion limit, maybe closed, maybe not."""
    opener = draw(OPENERS)
    depth = draw(st.one_of(st.integers(1, 40), st.integers(900, 1100), st.just(100_000)))
    return (opener * depth).encode()


def json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


HOSTILE_BYTES = st.one_of(
    st.binary(max_size=512),
    st.text(max_size=256).map(lambda text: text.encode("utf-8", "surrogatepass")),
    nests(),
    VALUES.map(json_bytes),
)
HOSTILE_TEXT = st.one_of(st.text(max_size=256), nests().map(bytes.decode), VALUES.map(json.dumps), st.just("\ud800"))


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ixdp-hostile-") as directory:
        yield Path(directory)


def written(directory: Path, name: str, data: bytes) -> Path:
    path = directory / name
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(data)
    return path


ANY_FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


# ---- the generic readers every document goes through ------------------------------------------------------------


@given(HOSTILE_BYTES)
def test_load_json_returns_plain_data_or_a_document_error(data: bytes) -> None:
    try:
        load_json(data)
    except DocumentError as error:
        assert str(error)


@given(HOSTILE_BYTES)
def test_load_yaml_returns_plain_data_or_a_document_error(data: bytes) -> None:
    try:
        load_yaml(data)
    except DocumentError as error:
        assert str(error)


# ---- the node-health record ---------------------------------------------------------------------------------------


def a_record() -> dict[str, Any]:
    chip = ChipRecord(minor=0, xids=frozenset({64}), phase="operator", causes=("XID 64",), reserved="a reset")
    return json.loads(record_text(HealthRecord(boot_id="b", writer="w", written=1.0, chips={"GPU-a": chip})))


RECORD_FIELDS = ["kind", "version", "bootID", "writer", "written", "chips", "extra"]
CHIP_FIELDS = ["minor", "xids", "phase", "causes", "attempts", "note", "outSince", "operatorReturn", "reserved",
               "resets", "resetLimitReached", "x"]  # fmt: skip


@given(HOSTILE_TEXT)
def test_the_record_is_read_or_refused_with_a_record_error(text: str) -> None:
    try:
        parse_record(text)
    except RecordError as error:
        assert str(error)


@given(st.sampled_from(RECORD_FIELDS), VALUES, st.sampled_from(CHIP_FIELDS), VALUES)
def test_any_value_in_any_record_field_is_read_or_refused_with_a_record_error(
    field: str, value: Any, chip_field: str, chip_value: Any
) -> None:
    for where in ("record", "chip"):
        document = a_record()
        if where == "record":
            document[field] = value
        else:
            document["chips"]["GPU-a"][chip_field] = chip_value
        try:
            record = parse_record(json.dumps(document))
        except RecordError as error:
            assert str(error)
        else:
            assert parse_record(record_text(record)).chips.keys() == record.chips.keys()  # written back, read again


RESET_TIMES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(1 << 70), 1 << 70), st.booleans(), st.none(), VALUES
)


@given(st.one_of(st.lists(RESET_TIMES, max_size=70), st.lists(st.floats(0, 1e10), max_size=70), VALUES))
def test_any_reset_history_is_read_back_the_same_or_refused_naming_the_field(resets: Any) -> None:
    document = a_record()
    document["chips"]["GPU-a"]["resets"] = resets
    try:
        record = parse_record(json.dumps(document))
    except RecordError as error:
        assert str(error).startswith("chips.GPU-a.resets ")
    else:
        chip = record.chips["GPU-a"]
        assert len(chip.resets) <= 64 and list(chip.resets) == sorted(chip.resets)
        again = parse_record(record_text(record)).chips["GPU-a"]
        assert again.resets == tuple(round(when, 3) for when in chip.resets)


@ANY_FIXTURE
@given(HOSTILE_BYTES)
def test_the_record_file_is_read_or_set_aside(scratch: Path, data: bytes) -> None:
    path = written(scratch, "node-health.json", data)
    reader = RecordFile(path)
    found = reader.read()
    assert (found is None) == bool(reader.unreadable)  # a record, or None with why (kept aside)
    for aside in scratch.glob("node-health.json.unreadable-*"):
        aside.unlink()


# ---- the healing story (`list` reads it) --------------------------------------------------------------------------


STORY_FIELDS = ["uuid", "minor", "phase", "causes", "attempts", "note", "out_since"]


@ANY_FIXTURE
@given(HOSTILE_BYTES)
def test_the_story_file_is_read_or_none(scratch: Path, data: bytes) -> None:
    story = read_story(written(scratch, "health.json", data))
    assert story is None or all(isinstance(story_line(chip), str) for chip in story["chips"])


@ANY_FIXTURE
@given(st.sampled_from(["self_healing", "written", "chips"]), VALUES, st.sampled_from(STORY_FIELDS), VALUES)
def test_any_value_in_a_story_is_shown_as_text(
    scratch: Path, field: str, value: Any, chip_field: str, chip_value: Any
) -> None:
    chip = {"uuid": "GPU-a", "minor": 0, "phase": "waiting", "causes": ["XID 48"], "attempts": 1, "note": ""}
    for document in ({"self_healing": "on", "written": 1.0, "chips": [chip], field: value},
                     {"self_healing": "on", "chips": [{**chip, chip_field: chip_value}, chip_value]}):  # fmt: skip
        story = read_story(written(scratch, "health.json", json_bytes(document)))
        if story is None:
            continue
        assert isinstance(story["chips"], list) and all(isinstance(chip, dict) for chip in story["chips"])
        assert story["self_healing"] is None or isinstance(story["self_healing"], str)
        for each in story["chips"]:
            assert isinstance(story_line(each), str) and isinstance(each["uuid"], str)


# ---- the DRA checkpoint, claim specs and metadata files -----------------------------------------------------------


@given(HOSTILE_BYTES)
def test_the_checkpoint_is_read_or_refused_with_a_checkpoint_error(data: bytes) -> None:
    try:
        parse_checkpoint(data, "cp")
    except CheckpointError as error:
        assert str(error).startswith("cp: ")


@given(HOSTILE_BYTES)
def test_a_claim_spec_file_is_read_or_refused_by_name(data: bytes) -> None:
    try:
        claim_from_spec("uid-1", load_yaml(data), "node-a")
    except (DocumentError, SpecError) as error:
        assert str(error)


@given(HOSTILE_TEXT)
def test_a_metadata_file_read_back_has_a_generation_or_none(text: str) -> None:
    generation = generation_of(text)
    assert generation is None or generation >= 1


# ---- ConfigMaps, annotations and labels ---------------------------------------------------------------------------


@given(st.one_of(HOSTILE_TEXT, VALUES.map(lambda value: json.dumps({"reset": value, "occupy": value}))))
def test_the_reset_document_is_read_or_refused_with_a_reset_error(text: str) -> None:
    try:
        ResetInfo.parse(text, "node-a", "ConfigMap ix-gpu-reset-node-a")
    except GpuResetError as error:
        assert str(error)


@given(st.dictionaries(st.sampled_from(["DeviceInfo", "DeviceList", "other"]), HOSTILE_TEXT, max_size=3))
def test_volcanos_device_config_map_is_read_key_by_key(data: dict[str, str]) -> None:
    content, latest = stored_content(data)
    assert isinstance(latest, int)
    assert all(document is None or isinstance(document, dict) for document in content.values())


@given(st.one_of(st.text(max_size=80), st.just("v" + "1" * 5000 + ".37"), st.just("v1.٣٧.0")))
def test_the_kubelet_version_is_read_or_unknown(version: str) -> None:
    assert keeps_several_endpoints(version) in (True, False, None)
    beside, why = register_beside("auto", version)
    assert isinstance(beside, bool) and why


@given(VALUES)
def test_the_kubelet_version_of_any_node_object_is_a_string_or_unknown(node: Any) -> None:
    nested = ({"status": node}, {"status": {"nodeInfo": node}}, {"status": {"nodeInfo": {"kubeletVersion": node}}})
    for obj in (node, *nested):
        version = node_kubelet_version(obj)
        assert version is None or isinstance(version, str)


@given(st.one_of(st.none(), st.text(max_size=300)))
def test_the_per_node_config_label_names_a_file_or_falls_back(label: str | None) -> None:
    options = Options(config_path=Path("/nonexistent-ixdp/config/ix-config.yaml"), per_node_config=True)
    path, why = config_file_for(options, label)
    assert why and path.parent == options.config_path.parent


@given(VALUES)
def test_any_api_object_is_read_as_a_document(obj: Any) -> None:
    for candidate in (obj, {"metadata": obj, "data": obj, "spec": obj, "status": obj},
                      {"spec": {"containers": [obj]}}, {"metadata": {"annotations": obj, "labels": obj}}):  # fmt: skip
        if not isinstance(candidate, dict):
            continue
        config_map_doc(candidate)
        pod_doc(candidate)
        assert isinstance(labels_of(candidate), dict)
        assert isinstance(uid_of(candidate), str) and isinstance(version_of(candidate), str)


ANNOTATIONS = st.dictionaries(
    st.sampled_from([DEV_VOLCANO, DEV_REAL_ALLOC, PREDICATE_TIME, "other"]),
    st.one_of(st.text(max_size=40), st.sampled_from(["", ",", "GPU-0,GPU-0", TAKEN, "18446744073709551616", "-1"])),
)


TRUST = Trust(node="node-a", resource_name="iluvatar.com/gpu", manager="vc-scheduler")


def _volcano_pod(index: int, annotations: dict[str, str], writer: str) -> dict[str, Any]:
    """A pod of this node asking for the resource, whose annotations writer wrote (as managedFields say)."""
    fields = {"f:metadata": {"f:annotations": {f"f:{key}": {} for key in annotations}}}
    return {
        "metadata": {
            "name": f"p{index}",
            "uid": f"u{index}",
            "annotations": annotations,
            "managedFields": [{"manager": writer, "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": fields}],
        },
        "spec": {
            "nodeName": "node-a",
            "containers": [{"name": "c", "resources": {"limits": {"iluvatar.com/gpu": "1"}}}],
        },
    }


@given(
    st.lists(ANNOTATIONS, min_size=1, max_size=4),
    st.integers(0, 4),
    st.sampled_from(["vc-scheduler", "kubectl-annotate"]),
)
def test_volcanos_pod_annotations_are_read_as_device_ids_and_times(
    annotations: list[dict[str, str]], size: int, writer: str
) -> None:
    pods = [pod_doc(_volcano_pod(i, a, writer)) for i, a in enumerate(annotations)]
    held = held_devices(pods, TRUST, frozenset({"u0"}))
    assert all(isinstance(device, str) for device in allocated_devices(pods))
    for pod in pods:
        assert 0 <= predicate_time(pod) <= 2**64 - 1
        assert isinstance(waiting_for(pod, size), bool)
        assert all(isinstance(device, str) for device, _ in clashes(pod, held))
        found = allocation_annotations(pod, ["GPU-1"], TRUST)
        assert found is None or all(isinstance(value, str) for value in found.values())
    chosen = oldest_waiting(pods, size, TRUST, held)
    assert chosen in (None, *pods)
    if writer != "vc-scheduler":  # a choice its owner wrote is never believed
        assert chosen is None


# ---- what the host says -------------------------------------------------------------------------------------------


@ANY_FIXTURE
@given(HOSTILE_BYTES)
def test_the_boot_id_is_text(scratch: Path, data: bytes) -> None:
    assert isinstance(read_boot_id(written(scratch, "boot_id", data)), str)


@ANY_FIXTURE
@given(HOSTILE_BYTES)
def test_sysfs_files_are_read_or_unknown(scratch: Path, data: bytes) -> None:
    device = scratch / "sys" / "bus/pci/devices" / "0000:8a:00.0"
    device.mkdir(parents=True, exist_ok=True)
    written(device, "numa_node", data)
    node = read_numa_node(scratch / "sys", "0000:8a:00.0")
    assert node is None or node >= 0
    dmi = scratch / "sys" / "class/dmi/id"
    dmi.mkdir(parents=True, exist_ok=True)
    written(dmi, "product_name", data)
    name = read_machine_name(scratch / "sys")
    assert name is None or isinstance(name, str)


# ---- a file that is not one -----------------------------------------------------------------------------------------


def fifo(path: Path) -> None:
    os.mkfifo(path)


def directory(path: Path) -> None:
    path.mkdir()


def symlink_to_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize("make", [fifo, directory, symlink_to_zero, empty])
def test_no_reader_of_a_node_file_hangs_or_crashes_on_something_that_is_not_a_file(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    for name, read in (
        ("node-health.json", lambda path: RecordFile(path).read()),
        ("health.json", read_story),
        ("checkpoint.json", _checkpoint_or_error),
        ("boot_id", read_boot_id),
    ):
        path = tmp_path / name
        make(path)
        read(path)  # returns within the test's time: a FIFO or /dev/zero is never read as a stream


def _checkpoint_or_error(path: Path) -> None:
    with contextlib.suppress(CheckpointError):
        read_checkpoint(path)
