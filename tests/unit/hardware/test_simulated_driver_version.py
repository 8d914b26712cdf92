"""The simulated backend reports a driver version as IXML does on a real node, so that what both front ends make
of it (the DRA `driverVersion` attribute, the driver version labels, `list`) is exercised without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ix_device_plugin.core.labels import DRIVER_VERSION, labels
from ix_device_plugin.core.plan import plan
from ix_device_plugin.dra.slices import device_body, slice_content
from ix_device_plugin.hardware.simulated import DEFAULT_DRIVER_VERSION, SimulatedBackend
from ix_device_plugin.settings.config import Config


def driver_version_attribute(source: str) -> object:
    content = slice_content(SimulatedBackend(source).discover())
    body = device_body(content.devices[0], content.driver_version, {})
    return body["attributes"].get("driverVersion")


def version_labels(source: str) -> dict[str, str]:
    inventory = SimulatedBackend(source).discover()
    found = labels(inventory, plan(inventory, Config()), Config(), None, None)
    return {name.removeprefix(f"{DRIVER_VERSION}."): value for name, value in found.items() if DRIVER_VERSION in name}


def devices_file(tmp_path: Path, head: str) -> str:
    path = tmp_path / "devices.yaml"
    path.write_text(f"{head}boards:\n  - product: BI-V150\n")
    return str(path)


def test_a_short_spec_reports_a_version_as_ixml_does_and_dra_publishes_it() -> None:
    assert SimulatedBackend("BI-V150:1").discover().driver_version == DEFAULT_DRIVER_VERSION == "4.4.0"
    assert driver_version_attribute("BI-V150:1") == {"version": "4.4.0"}
    assert version_labels("BI-V150:1") == {"full": "4.4.0", "major": "4", "minor": "4", "revision": "0"}


def test_a_file_without_driver_version_reports_the_default(tmp_path: Path) -> None:
    assert SimulatedBackend(devices_file(tmp_path, "")).discover().driver_version == DEFAULT_DRIVER_VERSION


@pytest.mark.parametrize(
    ("version", "attribute", "parts"),
    [
        ("4.1.0-rc1", {"version": "4.1.0+rc1"}, {"full": "4.1.0-rc1", "major": "4", "minor": "1", "revision": "0-rc1"}),
        ("3.4", {"version": "3.4.0"}, {"full": "3.4", "major": "3", "minor": "4", "revision": ""}),
        ("", None, {}),  # a library that reports no version: no attribute, no labels
    ],
)
def test_the_file_sets_the_version_and_both_front_ends_read_it_as_a_real_one(
    tmp_path: Path, version: str, attribute: object, parts: dict[str, str]
) -> None:
    source = devices_file(tmp_path, f'driver_version: "{version}"\n')
    assert SimulatedBackend(source).discover().driver_version == version
    assert driver_version_attribute(source) == attribute
    assert version_labels(source) == parts


def test_list_prints_the_simulated_driver_version(tmp_path: Path) -> None:
    source = devices_file(tmp_path, 'driver_version: "4.1.0-rc1"\n')
    argv = [sys.executable, "-m", "ix_device_plugin", "list", "--backend", "simulated", "--simulated-devices"]
    shown = subprocess.run([*argv, source], capture_output=True, text=True, timeout=30, check=True).stdout
    assert "Driver version: 4.1.0-rc1" in shown
    shown = subprocess.run([*argv, "BI-V150:1"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert "Driver version: 4.4.0" in shown
