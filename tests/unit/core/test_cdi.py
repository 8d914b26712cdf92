"""CDI spec content and names (pure), and the spec file writer (real files)."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from ix_device_plugin.core.cdi import (
    CDI_KIND,
    annotations,
    build_spec,
    minimum_version,
    qualified_names,
    spec,
)
from ix_device_plugin.core.inventory import Board, Chip, Inventory
from ix_device_plugin.deviceplugin.outputs import CDI_SPEC_FILE, CdiSpecWriter, OutputError, cdi_generate
from ix_device_plugin.hardware.simulated import parse_spec

ROOT = Path("/")
# The deterministic UUIDs of `BI-V150:2` in the simulated backend: board 0 chips 0-1, board 1 chips 0-1.
UUIDS = (
    "GPU-46dac803-6433-5dc2-8666-22bb47410ff6",
    "GPU-168db3a0-f1fe-508d-b744-75122bfd1a53",
    "GPU-eaaff3ac-9386-5659-97d2-e5ef0e4c36a7",
    "GPU-9ba039f2-aa03-5568-95a5-c777d05b15ae",
)


def two_bi_v150(control_nodes: tuple[str, ...] = ()) -> Inventory:
    return Inventory(boards=parse_spec("BI-V150:2"), control_nodes=control_nodes)


def node(path: str, host: str | None = None) -> dict[str, str]:
    return {"path": path} if host is None else {"path": path, "hostPath": host}


def test_two_bi_v150_with_itrctl() -> None:
    assert spec(two_bi_v150(("/dev/itrctl",)), ROOT) == {
        "cdiVersion": "0.3.0",
        "kind": "iluvatar.com/gpu",
        "devices": [
            {"name": UUIDS[0], "containerEdits": {"deviceNodes": [node("/dev/iluvatar0")]}},
            {"name": UUIDS[1], "containerEdits": {"deviceNodes": [node("/dev/iluvatar1")]}},
            {"name": UUIDS[2], "containerEdits": {"deviceNodes": [node("/dev/iluvatar2")]}},
            {"name": UUIDS[3], "containerEdits": {"deviceNodes": [node("/dev/iluvatar3")]}},
            {"name": "all", "containerEdits": {"deviceNodes": [node(f"/dev/iluvatar{i}") for i in range(4)]}},
        ],
        "containerEdits": {"deviceNodes": [node("/dev/itrctl")]},
    }


def test_without_itrctl_there_are_no_spec_wide_edits() -> None:
    document = spec(two_bi_v150(), ROOT)
    assert "containerEdits" not in document
    assert [device["name"] for device in document["devices"]] == [*UUIDS, "all"]
    assert document["cdiVersion"] == "0.3.0"


def test_dev_root_gives_host_paths_and_version_0_5_0() -> None:
    document = spec(two_bi_v150(("/dev/itrctl",)), Path("/host"))
    assert document["cdiVersion"] == "0.5.0"
    assert document["devices"][2] == {
        "name": UUIDS[2],
        "containerEdits": {"deviceNodes": [node("/dev/iluvatar2", "/host/dev/iluvatar2")]},
    }
    assert document["devices"][4]["containerEdits"]["deviceNodes"] == [
        node(f"/dev/iluvatar{i}", f"/host/dev/iluvatar{i}") for i in range(4)
    ]
    assert document["containerEdits"] == {"deviceNodes": [node("/dev/itrctl", "/host/dev/itrctl")]}


def test_device_names_starting_with_a_digit_need_0_5_0() -> None:
    inventory = Inventory(boards=(Board("BI-V100", (Chip("0c1d-uuid", 0, "BI-V100"),)),))
    assert spec(inventory, ROOT)["cdiVersion"] == "0.5.0"
    assert minimum_version({"devices": [{"name": "a", "containerEdits": {"deviceNodes": [node("/dev/x")]}}]}) == (
        "0.3.0"
    )


def test_chips_without_a_minor_or_with_unusable_uuids_are_left_out_with_a_warning() -> None:
    chips = (
        Chip("GPU-a", 0, "BI-V100"),
        Chip("GPU-b", None, "BI-V100"),
        Chip("GPU-a", 2, "BI-V100"),
        Chip("bad uuid!", 3, "BI-V100"),
        Chip("all", 4, "BI-V100"),
    )
    result = build_spec(Inventory(boards=tuple(Board("BI-V100", (chip,)) for chip in chips)), ROOT)
    assert [device["name"] for device in result.document["devices"]] == ["GPU-a", "all"]
    assert result.document["devices"][1]["containerEdits"]["deviceNodes"] == [node("/dev/iluvatar0")]
    assert result.warnings == (
        "chip 'GPU-b' left out of the CDI spec: its minor number, and so its device node, is unknown",
        "chip 'GPU-a' left out of the CDI spec: another chip has the same UUID",
        "chip 'bad uuid!' left out of the CDI spec: the UUID is not a valid CDI device name",
        "chip 'all' left out of the CDI spec: the UUID clashes with the device 'all'",
    )
    assert result.chip_devices == 1


def test_no_describable_chip_is_an_empty_spec() -> None:
    result = build_spec(Inventory(boards=(Board("BI-V100", (Chip("GPU-x", None, "BI-V100"),)),)), ROOT)
    assert result.empty
    assert result.document["devices"] == []


def test_qualified_names() -> None:
    assert qualified_names(UUIDS[:2]) == [f"iluvatar.com/gpu={UUIDS[0]}", f"iluvatar.com/gpu={UUIDS[1]}"]
    assert CDI_KIND == "iluvatar.com/gpu"


def test_annotations_key_and_value_as_the_cdi_library_makes_them() -> None:
    names = qualified_names(UUIDS[:2])
    response = "4f2c1a9e-0b7d-4c55-9d61-3a8e2f7c1b20"
    assert annotations(names, response) == {f"cdi.k8s.io/ix-device-plugin_{response}": ",".join(names)}
    assert annotations(names[:1], "pod/ctr") == {"cdi.k8s.io/ix-device-plugin_pod_ctr": names[0]}


@pytest.mark.parametrize(
    ("names", "response_id", "message"),
    [
        ([], "x", "no device names"),
        (["iluvatar.com/gpu=a"], "", "must not be empty"),
        (["iluvatar.com/gpu=a"], "x" * 60, "longer than 63"),
        (["iluvatar.com/gpu=a"], "bad id-", "must start and end"),
        (["GPU-a"], "x", "not a qualified CDI device name"),
    ],
)
def test_bad_annotation_requests_are_refused(names: list[str], response_id: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        annotations(names, response_id)


# The writer, on real files.


def test_writer_creates_the_directory_and_writes_yaml(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path / "cdi", Path("/host"))
    assert writer.apply(two_bi_v150(("/dev/itrctl",)))
    path = tmp_path / "cdi" / CDI_SPEC_FILE
    assert path.name == "iluvatar.com-gpu.yaml"
    assert yaml.safe_load(path.read_text()) == spec(two_bi_v150(("/dev/itrctl",)), Path("/host"))
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert sorted(os.listdir(tmp_path / "cdi")) == [CDI_SPEC_FILE]  # no temporary file left


def test_writer_rewrites_only_on_change(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path, ROOT)
    inventory = two_bi_v150()
    assert writer.apply(inventory)
    before = os.stat(writer.path)
    assert not writer.apply(inventory)
    assert not CdiSpecWriter(tmp_path, ROOT).apply(inventory)  # a new writer compares with the file on disk
    after = os.stat(writer.path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert writer.apply(replace(inventory, control_nodes=("/dev/itrctl",)))
    assert os.stat(writer.path).st_ino != before.st_ino
    assert "/dev/itrctl" in writer.path.read_text()


def test_writer_repairs_a_file_edited_by_hand(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path, ROOT)
    writer.apply(two_bi_v150())
    writer.path.write_text("garbage")
    assert writer.apply(two_bi_v150())
    assert yaml.safe_load(writer.path.read_text())["kind"] == CDI_KIND


def test_writer_removes_the_spec_when_no_chip_is_left(tmp_path: Path) -> None:
    writer = CdiSpecWriter(tmp_path, ROOT)
    writer.apply(two_bi_v150())
    assert writer.apply(Inventory())
    assert not writer.path.exists()
    assert not writer.apply(Inventory())
    lost = Inventory(boards=(Board("BI-V100", (Chip("GPU-x", None, "BI-V100"),)),))
    assert not writer.apply(lost)
    assert writer.warnings == (
        "chip 'GPU-x' left out of the CDI spec: its minor number, and so its device node, is unknown",
    )


def test_writer_failure_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.raises(OutputError, match="not-a-directory"):
        CdiSpecWriter(blocker / "cdi", ROOT).apply(two_bi_v150())


def test_readers_never_see_a_partial_spec(tmp_path: Path) -> None:
    inventories = [two_bi_v150(), two_bi_v150(("/dev/itrctl",))]
    expected = [spec(inventory, ROOT) for inventory in inventories]
    writer = CdiSpecWriter(tmp_path, ROOT)
    writer.apply(inventories[0])
    seen: list[object] = []
    stray: set[str] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            for name in os.listdir(tmp_path):
                if name == CDI_SPEC_FILE:
                    seen.append(yaml.safe_load((tmp_path / name).read_text()))
                elif name.endswith((".yaml", ".json")) or not name.startswith("."):
                    stray.add(name)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            assert writer.apply(inventories[(i + 1) % 2])
    finally:
        done.set()
        reader.join()
    assert seen, "the reader never saw the file"
    assert all(document in expected for document in seen)
    assert not stray  # temporary files are dot-files a CDI runtime does not read


def test_cdi_generate_returns_and_writes_the_same_text(tmp_path: Path) -> None:
    output = tmp_path / "out" / "spec.yaml"
    text = cdi_generate(two_bi_v150(), ROOT, output)
    assert output.read_text() == text
    assert yaml.safe_load(text) == spec(two_bi_v150(), ROOT)
    assert cdi_generate(two_bi_v150(), ROOT) == text


def test_cdi_generate_without_chips_says_why() -> None:
    with pytest.raises(OutputError, match="needs at least one device"):
        cdi_generate(Inventory(), ROOT)
