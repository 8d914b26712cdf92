"""Node labels (pure), the NFD feature file writer and the DMI machine name (real files)."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ix_device_plugin.core.inventory import Board, Chip, ChipStatus, Inventory
from ix_device_plugin.core.labels import (
    is_valid_label_value,
    label_set,
    labels,
    parse_cuda_version,
    parse_driver_version,
    sanitise_label_value,
)
from ix_device_plugin.core.plan import plan
from ix_device_plugin.hardware.simulated import parse_spec
from ix_device_plugin.nodelabels.featurefile import FeatureFileWriter, feature_file_text, read_machine_name
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.settings.config import Config

DRIVER = "4.2.0"


def node_labels(
    spec: str, config: Config, machine: str | None = "X580-G30", cuda: str | None = "10020", driver: str = DRIVER
) -> dict[str, str]:
    inventory = Inventory(boards=parse_spec(spec), driver_version=driver)
    return labels(inventory, plan(inventory, config), config, machine, cuda)


def common(product: str, count: int, boards: int, memory: int = 32768) -> dict[str, str]:
    return {
        "iluvatar.com/gpu.present": "true",
        "iluvatar.com/gpu.product": product,
        "iluvatar.com/gpu.count": str(count),
        "iluvatar.com/gpu.memory": str(memory),
        "iluvatar.com/gpu.boards": str(boards),
        "iluvatar.com/gpu.machine": "X580-G30",
        "iluvatar.com/ix.driver-version.full": "4.2.0",
        "iluvatar.com/ix.driver-version.major": "4",
        "iluvatar.com/ix.driver-version.minor": "2",
        "iluvatar.com/ix.driver-version.revision": "0",
        "iluvatar.com/cuda.runtime-version.full": "10.2",
        "iluvatar.com/cuda.runtime-version.major": "10",
        "iluvatar.com/cuda.runtime-version.minor": "2",
    }


def sharing(splitboard: bool, healthy: int, replicas: int) -> dict[str, str]:
    return {
        "iluvatar.com/gpu.splitboard": "true" if splitboard else "false",
        "iluvatar.com/gpu.healthy": str(healthy),
        "iluvatar.com/gpu.replicas": str(replicas),
        "iluvatar.com/gpu.sharing-strategy": "time-slicing" if replicas > 1 else "none",
    }


# The README's capacity table: node, splitboard, replicas -> capacity (= healthy devices here).
@pytest.mark.parametrize(
    ("spec", "splitboard", "replicas", "capacity", "replicas_label"),
    [
        ("BI-V150:2", False, 0, 2, 1),
        ("BI-V150:2", True, 0, 4, 1),
        ("BI-V150:2", False, 4, 8, 4),
        ("BI-V150:2", True, 4, 16, 4),
        ("BI-V100:2", False, 4, 8, 4),
        ("BI-V100:2", True, 4, 8, 4),
        ("BI-V100:2", False, 1, 2, 1),
    ],
)
def test_capacity_table_configurations(
    spec: str, splitboard: bool, replicas: int, capacity: int, replicas_label: int
) -> None:
    product, boards = spec.split(":")
    chips = 2 * int(boards) if product == "BI-V150" else int(boards)
    assert node_labels(spec, Config(splitboard=splitboard, replicas=replicas)) == {
        **common(product, chips, int(boards)),
        **sharing(splitboard, capacity, replicas_label),
    }


def test_healthy_counts_only_healthy_advertised_devices() -> None:
    inventory = Inventory(boards=parse_spec("BI-V150:2"), driver_version=DRIVER)
    first = next(inventory.chips())
    broken = inventory.with_statuses({first.uuid: ChipStatus(errors=frozenset({"ECC"}))})
    config = Config(replicas=4)
    result = labels(broken, plan(broken, config), config, None, None)
    assert result["iluvatar.com/gpu.healthy"] == "4"  # the first board's 4 replicas are Unhealthy
    assert result["iluvatar.com/gpu.count"] == "4"


def test_unknown_machine_and_cuda_version_leave_their_labels_out() -> None:
    result = node_labels("BI-V150:1", Config(), machine=None, cuda=None)
    assert not any(name.startswith(("iluvatar.com/gpu.machine", "iluvatar.com/cuda.")) for name in result)
    assert result["iluvatar.com/ix.driver-version.full"] == DRIVER


def test_machine_name_is_sanitised() -> None:
    assert node_labels("BI-V150:1", Config(), machine="  Inspur NF5468M6 (A)\n")["iluvatar.com/gpu.machine"] == (
        "Inspur-NF5468M6-A"
    )
    assert "iluvatar.com/gpu.machine" not in node_labels("BI-V150:1", Config(), machine="(!)")


def test_driver_version_with_two_parts_has_an_empty_revision() -> None:
    result = node_labels("BI-V150:1", Config(), driver="4.1")
    assert result["iluvatar.com/ix.driver-version.full"] == "4.1"
    assert result["iluvatar.com/ix.driver-version.revision"] == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4.1.0", ("4", "1", "0")),
        ("4.1.0-rc1", ("4", "1", "0-rc1")),
        ("4.1", ("4", "1", "")),
        ("4.4.0_20240801", ("4", "4", "0_20240801")),
        ("4..1", ("4", "", "1")),
        ("4", None),
        ("4.1.0.1", None),
        ("", None),
        ("simulated", None),
    ],
)
def test_driver_version_is_split_on_dots_as_ix_feature_discovery_does(
    text: str, expected: tuple[str, str, str] | None
) -> None:
    assert parse_driver_version(text) == expected


def test_a_release_candidate_driver_keeps_its_labels() -> None:
    result = node_labels("BI-V150:1", Config(), driver=" 4.1.0-rc1\n")
    assert {name: value for name, value in result.items() if "driver-version" in name} == {
        "iluvatar.com/ix.driver-version.full": "4.1.0-rc1",
        "iluvatar.com/ix.driver-version.major": "4",
        "iluvatar.com/ix.driver-version.minor": "1",
        "iluvatar.com/ix.driver-version.revision": "0-rc1",
    }


def test_a_driver_version_part_that_is_no_label_value_is_a_note() -> None:
    inventory = Inventory(boards=parse_spec("BI-V150:1"), driver_version="4.1.0 (beta)")
    result = label_set(inventory, plan(inventory, Config()), Config(), None, None)
    assert not any("driver-version" in name for name in result.labels)
    assert result.notes == (
        "driver version '4.1.0 (beta)' gives iluvatar.com/ix.driver-version.full '4.1.0 (beta)', "
        "not a valid label value: no driver version labels",
    )


def test_unreadable_versions_are_notes_not_labels() -> None:
    inventory = Inventory(boards=parse_spec("BI-V150:1"), driver_version="simulated")
    result = label_set(inventory, plan(inventory, Config()), Config(), None, "twelve")
    assert not any("version" in name for name in result.labels)
    assert result.notes == (
        "driver version 'simulated' is not of the form X.Y[.Z]: no driver version labels",
        "CUDA version 'twelve' is neither an integer like 10020 nor X.Y: no CUDA version labels",
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10020", (10, 2)), ("12040", (12, 4)), ("10.2", (10, 2)), (" 11.8 ", (11, 8)), ("1.2.3", None)],
)
def test_cuda_version(text: str, expected: tuple[int, int] | None) -> None:
    assert parse_cuda_version(text) == expected


def test_mixed_products_label_the_most_common_and_say_so() -> None:
    def chip(uuid: str, minor: int, product: str, memory: int) -> Chip:
        return Chip(uuid, minor, product, memory_mib=memory)

    boards = (
        Board("Iluvatar MR-V100", (chip("GPU-1", 0, "Iluvatar MR-V100", 32768),)),
        Board(
            "Iluvatar BI-V150",
            (chip("GPU-2", 1, "Iluvatar BI-V150", 32768), chip("GPU-3", 2, "Iluvatar BI-V150", 32000)),
        ),
    )
    inventory = Inventory(boards=boards, driver_version=DRIVER)
    result = label_set(inventory, plan(inventory, Config()), Config(), None, None)
    assert result.labels["iluvatar.com/gpu.product"] == "BI-V150"
    assert result.labels["iluvatar.com/gpu.count"] == "2"
    assert result.labels["iluvatar.com/gpu.memory"] == "32000"  # the least any chip of it has
    assert result.labels["iluvatar.com/gpu.boards"] == "2"
    assert result.notes == (
        "chips of several products on this node (2 x BI-V150, 1 x MR-V100); labels describe BI-V150",
    )


def test_a_product_tie_labels_the_first_seen() -> None:
    inventory = Inventory(boards=parse_spec("MR-V50:1,BI-V100:1"), driver_version=DRIVER)
    assert labels(inventory, plan(inventory, Config()), Config(), None, None)["iluvatar.com/gpu.product"] == "MR-V50"


def test_unknown_memory_leaves_the_memory_label_out() -> None:
    inventory = Inventory(boards=(Board("BI-V100", (Chip("GPU-1", 0, "BI-V100"),)),), driver_version=DRIVER)
    assert "iluvatar.com/gpu.memory" not in labels(inventory, plan(inventory, Config()), Config(), None, None)


def test_a_node_without_chips_has_no_labels() -> None:
    inventory = Inventory(driver_version=DRIVER)
    assert label_set(inventory, plan(inventory, Config()), Config(), "X580", "10020").labels == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("X580-G30", "X580-G30"),
        ("  PowerEdge R750xa ", "PowerEdge-R750xa"),
        ("To be filled by O.E.M.", "To-be-filled-by-O.E.M"),
        ("--abc--", "abc"),
        ("ünïcode 名前", "ncode"),
        ("", ""),
        ("x" * 70, "x" * 63),
        ("a" * 62 + "-b", "a" * 62),
    ],
)
def test_sanitise_examples(text: str, expected: str) -> None:
    assert sanitise_label_value(text) == expected


@given(st.text())
def test_sanitise_always_gives_a_valid_label_value(text: str) -> None:
    assert is_valid_label_value(sanitise_label_value(text))


@given(st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", fullmatch=True))
def test_sanitise_keeps_valid_values(value: str) -> None:
    assert sanitise_label_value(value) == value


def test_every_label_is_valid_on_a_big_node() -> None:
    result = node_labels("BI-V150:16", Config(splitboard=True, replicas=64))
    assert all(is_valid_label_value(value) for value in result.values())
    assert result["iluvatar.com/gpu.healthy"] == "2048"


# The feature file writer and the machine name, on real files.


def test_feature_file_format(tmp_path: Path) -> None:
    writer = FeatureFileWriter(tmp_path / "features.d")
    assert writer.apply({"iluvatar.com/gpu.present": "true", "iluvatar.com/gpu.count": "4"})
    assert writer.path == tmp_path / "features.d" / "ix-device-plugin"
    lines = writer.path.read_text().splitlines()
    assert lines[0].startswith("# ")
    assert lines[1:] == ["iluvatar.com/gpu.count=4", "iluvatar.com/gpu.present=true"]
    assert os.stat(writer.path).st_mode & 0o777 == 0o644


def test_feature_file_rewritten_only_on_change_and_removed(tmp_path: Path) -> None:
    writer = FeatureFileWriter(tmp_path, "gpu")
    labels_now = node_labels("BI-V150:2", Config())
    assert writer.apply(labels_now)
    before = os.stat(writer.path)
    assert not writer.apply(dict(reversed(labels_now.items())))
    assert not FeatureFileWriter(tmp_path, "gpu").apply(labels_now)
    after = os.stat(writer.path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert writer.apply({**labels_now, "iluvatar.com/gpu.healthy": "1"})
    assert "iluvatar.com/gpu.healthy=1\n" in writer.path.read_text()
    assert writer.remove()
    assert not writer.path.exists()
    assert not writer.remove()
    assert os.listdir(tmp_path) == []


def test_no_labels_remove_the_file(tmp_path: Path) -> None:
    writer = FeatureFileWriter(tmp_path)
    writer.apply({"iluvatar.com/gpu.present": "true"})
    assert writer.apply({})
    assert not writer.path.exists()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("iluvatar.com/gpu.product", "BI V150", "not a valid label value"),
        ("iluvatar.com/gpu.product", "x" * 64, "not a valid label value"),
        ("iluvatar.com/gpu product", "a", "not a valid label name"),
        ("Iluvatar_com/gpu", "a", "not a valid label name"),
        ("", "a", "not a valid label name"),
    ],
)
def test_bad_labels_are_refused_and_nothing_is_written(tmp_path: Path, name: str, value: str, message: str) -> None:
    writer = FeatureFileWriter(tmp_path)
    with pytest.raises(OutputError, match=message):
        writer.apply({name: value})
    assert not writer.path.exists()


@pytest.mark.parametrize("name", ["", ".hidden", "a/b"])
def test_bad_feature_file_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(OutputError, match="feature file name"):
        FeatureFileWriter(tmp_path, name)


def test_feature_file_failure_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match=r"file/features\.d"):
        FeatureFileWriter(tmp_path / "file" / "features.d").apply({"iluvatar.com/gpu.present": "true"})


def test_nfd_never_sees_a_partial_feature_file(tmp_path: Path) -> None:
    versions = [node_labels("BI-V150:2", Config()), node_labels("BI-V150:2", Config(splitboard=True, replicas=4))]
    expected = {feature_file_text(version) for version in versions}
    writer = FeatureFileWriter(tmp_path)
    writer.apply(versions[0])
    seen: list[str] = []
    visible: set[str] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            for name in os.listdir(tmp_path):
                if not name.startswith("."):  # NFD skips dot-files
                    visible.add(name)
                    seen.append((tmp_path / name).read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(200):
            assert writer.apply(versions[(i + 1) % 2])
    finally:
        done.set()
        reader.join()
    assert seen, "the reader never saw the file"
    assert set(seen) <= expected
    assert visible == {"ix-device-plugin"}


def test_read_machine_name(tmp_path: Path) -> None:
    dmi = tmp_path / "class" / "dmi" / "id"
    assert read_machine_name(tmp_path) is None
    dmi.mkdir(parents=True)
    (dmi / "product_name").write_bytes(b"X580-G30\n")
    assert read_machine_name(tmp_path) == "X580-G30"
    (dmi / "product_name").write_bytes(b"  \n")
    assert read_machine_name(tmp_path) is None
    (dmi / "product_name").write_bytes(b"Caf\xe9 Box\n")
    assert read_machine_name(tmp_path) == "Caf\ufffd Box"


def test_labels_change_when_the_config_does(tmp_path: Path) -> None:
    inventory = Inventory(boards=parse_spec("BI-V150:2"), driver_version=DRIVER)
    writer = FeatureFileWriter(tmp_path)
    for config in (Config(), Config(splitboard=True), replace(Config(), replicas=4)):
        assert writer.apply(labels(inventory, plan(inventory, config), config, None, None))
    assert "iluvatar.com/gpu.sharing-strategy=time-slicing" in writer.path.read_text()
