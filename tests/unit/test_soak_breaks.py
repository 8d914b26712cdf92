"""The soak's deliberately broken builds (e2e/soak/breaks.py): each break, patched in as the agent's pod patches it
(a `sitecustomize.py` on PYTHONPATH, SOAK_BREAKS naming it), makes the defect it says, in a Python of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.helpers.soak_modules import load

breaks = load("breaks")

SHOWN = """
import asyncio, os, sys
from pathlib import Path
from ix_device_plugin.api import UNHEALTHY
from ix_device_plugin.core.inventory import ChipStatus
from ix_device_plugin.core.plan import plan
from ix_device_plugin.deviceplugin import service
from ix_device_plugin.deviceplugin.chipguard import PodHolders
from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.dra.specfiles import ClaimSpecFiles
from ix_device_plugin.hardware import simulated
from ix_device_plugin.settings.config import Config

work = Path(sys.argv[1])
inventory = simulated.SimulatedBackend("BI-V150:2").discover()
whole = plan(inventory, Config())
board = whole.devices[0]
response = service._allocate_response(whole, service.api_pb2.AllocateRequest(
    container_requests=[service.api_pb2.ContainerAllocateRequest(devices_ids=[board.id])]))
print("visible", len(response.container_responses[0].envs["IX_VISIBLE_DEVICES"].split(",")), len(board.chips))
try:  # the agent's own asks pod-resources (of a guard this script has not made)
    print("holder", asyncio.run(PodHolders.holder(None, board.chips[0].uuid)))
except AttributeError:
    print("holder asked")
first = board.chips[0].uuid
broken = plan(inventory.with_statuses({first: ChipStatus(problems=("XID 48",))}), Config())
for step in (whole, broken, whole):
    print("listed", [d.health == UNHEALTHY for d in service.list_response(step).devices])
devices = work / "devices.yaml"
devices.write_text("boards: []\\n")
before = len(os.listdir("/proc/self/fd"))
simulated._read_bytes(devices)
print("leaked", len(os.listdir("/proc/self/fd")) - before)
spec = work / cdi_spec_file("0b7e4d6a-1c2f-4e5a-9b8c-3d2e1f0a9b8c")
spec.write_text("kind: x\\n")
ClaimSpecFiles(work, "pool").remove("0b7e4d6a-1c2f-4e5a-9b8c-3d2e1f0a9b8c")
print("spec kept", spec.exists())
"""


def run_with(names: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / "corex" / breaks.FOLDER
    breaks.write(folder)
    env = {**os.environ, "PYTHONPATH": str(folder), breaks.ENV: names}
    return subprocess.run(
        [sys.executable, "-c", SHOWN, str(tmp_path)], capture_output=True, text=True, env=env, check=True, timeout=60
    )


def test_each_break_makes_its_defect_in_the_agents_code(tmp_path: Path) -> None:
    result = run_with(",".join(breaks.BREAKS), tmp_path)
    assert "not applied" not in result.stderr, result.stderr
    assert result.stderr.count("soak break applied") == len(breaks.BREAKS), result.stderr
    lines = result.stdout.splitlines()
    assert "visible 1 2" in lines  # a board of two chips, one named
    assert "holder None" in lines
    # Healthy, then its board broken, then healed: still listed Unhealthy.
    assert [line for line in lines if line.startswith("listed")] == [
        "listed [False, False]",
        "listed [True, False]",
        "listed [True, False]",
    ]
    assert f"leaked {breaks.LEAK_PER_READ}" in lines
    assert "spec kept True" in lines


def test_without_breaks_the_same_code_is_right(tmp_path: Path) -> None:
    """The same script with none named: the agent's own behaviour (so each line above is the break's doing)."""
    lines = run_with("", tmp_path).stdout.splitlines()
    assert "visible 2 2" in lines
    assert "holder asked" in lines
    assert [line for line in lines if line.startswith("listed")][-1] == "listed [False, False]"
    assert "leaked 0" in lines
    assert "spec kept False" in lines


def test_install_puts_the_file_in_corex_and_names_it_in_the_environment_and_refuses_an_unknown_break(
    tmp_path: Path,
) -> None:
    agent = SimpleNamespace(hardware=SimpleNamespace(corex=tmp_path))
    breaks.install(agent, ["holder-always-free", "devices-file-leaks"])
    assert agent.extra_env(Path("/usr/local/corex")) == [
        {"name": "PYTHONPATH", "value": f"/usr/local/corex/{breaks.FOLDER}"},
        {"name": breaks.ENV, "value": "holder-always-free,devices-file-leaks"},
    ]
    assert (tmp_path / breaks.FOLDER / "sitecustomize.py").read_text() == Path(breaks.__file__).read_text()
    try:
        breaks.install(agent, ["no-such-break"])
    except AssertionError as error:
        assert "no-such-break" in str(error)
    else:
        raise AssertionError("an unknown break was accepted")
