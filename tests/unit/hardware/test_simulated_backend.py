"""Hostile simulated device files and specs: every one is a clear BackendError, through `list` and at run time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.reset_support import fake_ixsmi
from helpers.support import TESTS_DIR

from ix_device_plugin.hardware import simulated
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.simulated import REWRITE_PAUSE, SimulatedBackend

CORPUS = TESTS_DIR / "hostile" / "devices"
EXPECTED = {
    "duplicate_uuid.yaml": "boards[0].chips[1].uuid: GPU-a is also boards[0].chips[0]'s",
    "uuid_with_comma.yaml": "boards[0].chips[0].uuid: expected 1-63 letters, digits",
    "uuid_with_replica_marker.yaml": "(no ',' or '::', which separate device IDs), got 'GPU-a::0'",
    "duplicate_minor.yaml": "boards[0].chips[1].minor: 3 is also boards[0].chips[0]'s",
    "negative_minor.yaml": "boards[0].chips[0].minor: expected a whole number from 0 to 1048575, got -2",
    "binary.yaml": "holds a NUL byte at offset 0: this is binary data, not YAML",
    "deep.yaml": "nested more than 32 levels deep",
    "alias.yaml": "line 1, column 4: anchor &x: anchors and aliases are not allowed here",
    "custom_tag.yaml": "line 2, column 5: the tag !chip is not allowed here",
    "health_not_a_list.yaml": "boards[0].chips[0].health: expected a list of error names, got 'OverTemp'",
    "number_key.yaml": "boards[0]: unknown key '1' (known: chips, product)",
    "product_typo.yaml": "unknown product 'BI-V15O'; did you mean 'BI-V150'?",
    "utf16.yaml": "looks like UTF-16 or UTF-32 text; save it as UTF-8",
    "no_boards.yaml": "expected a mapping with a `boards:` list",
    "driver_version_number.yaml": 'driver_version: expected a quoted string such as "4.1.0-rc1", got 4.1',
    "driver_version_not_ascii.yaml": "driver_version: expected at most 79 printable ASCII characters",
}
SPECS = {
    "BI-V150:²": "count in 'BI-V150:²' must be a whole number from 1 to 256",
    "BI-V150:0": "must be a whole number from 1 to 256",
    "BI-V150:-1": "must be a whole number from 1 to 256",
    "BI-V150:99999": "must be a whole number from 1 to 256",
    "BI-V15:1": "unknown product 'BI-V15'; did you mean 'BI-V150'?",
}


def list_devices(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ix_device_plugin", "list", "--backend", "simulated", "--simulated-devices", source],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_corpus_and_the_table_agree() -> None:
    assert sorted(path.name for path in CORPUS.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_hostile_device_file_is_one_clear_error(name: str) -> None:
    with pytest.raises(BackendError) as error:
        SimulatedBackend(str(CORPUS / name)).discover()
    assert EXPECTED[name] in str(error.value)
    assert str(CORPUS / name) in str(error.value)


@pytest.mark.parametrize("source", [*sorted(SPECS), str(CORPUS / "duplicate_uuid.yaml")])
def test_list_prints_the_error_without_a_traceback(source: str) -> None:
    result = list_devices(source)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    assert SPECS.get(source, "is also") in result.stderr


def test_a_file_that_turns_bad_while_running_fails_the_poll_cleanly(tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text("boards:\n  - product: BI-V150\n")
    backend = SimulatedBackend(str(devices))
    inventory = backend.discover()
    devices.write_bytes((CORPUS / "binary.yaml").read_bytes())
    with pytest.raises(BackendError, match="binary data"):
        backend.health(inventory)


def test_a_named_ixsmi_is_run_for_each_reset_and_its_failure_fails_it(tmp_path: Path) -> None:
    record = tmp_path / "args"
    ixsmi = fake_ixsmi(tmp_path / "ixsmi", f'echo "$@" >> {record}; exit $(cat {tmp_path / "code"})')
    (tmp_path / "code").write_text("0")
    backend = SimulatedBackend("BI-V100:2", ixsmi_path=ixsmi)
    chip = next(backend.discover().chips()).uuid
    backend.reset([chip], 5.0)
    assert record.read_text().split() == ["-r", "-i", chip]
    (tmp_path / "code").write_text("4")
    with pytest.raises(BackendError, match="exited with code 4"):
        backend.reset([chip], 5.0)
    SimulatedBackend("BI-V100:2").reset([chip], 5.0)  # without one, nothing is run
    assert len(record.read_text().splitlines()) == 2


def test_a_file_being_rewritten_in_place_is_read_once_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text("boards:\n  - product: BI-V150\n")
    backend = SimulatedBackend(str(path))
    inventory = backend.discover()
    path.write_text("")  # truncated: the writer has not written yet
    pauses: list[float] = []

    def writer_finishes(seconds: float) -> None:  # the writer writes while the backend waits
        pauses.append(seconds)
        path.write_text("boards:\n  - product: BI-V150\n")

    monkeypatch.setattr(simulated.time, "sleep", writer_finishes)
    statuses = backend.health(inventory)
    assert pauses == [REWRITE_PAUSE]
    assert len(statuses) == 2 and all(status.reasons() == () for status in statuses.values())


def test_a_file_that_stays_empty_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text("boards:\n  - product: BI-V150\n")
    backend = SimulatedBackend(str(path))
    inventory = backend.discover()
    path.write_text("\n")
    with pytest.raises(BackendError, match="expected a mapping with a `boards:` list"):
        backend.health(inventory)


def test_the_simulated_chips_uuids_are_uuid5s_of_their_place() -> None:
    # computed without OpenSSL's hashes (uuid.uuid5 loads them), yet the same UUIDs as ever
    import uuid

    for board in range(40):
        for chip in range(4):
            expected = f"GPU-{uuid.uuid5(simulated._UUID_NAMESPACE, f'{board}/{chip}')}"
            assert simulated.default_uuid(board, chip) == expected
