"""A drop-in for Iluvatar's plugin 4.4.0: its variables, flags and ix-config files, through the real plugin.

Each scenario is something 4.4.0 runs with (cmd/main.go, pkg/config): the plugin process serves it with the same
meaning, and the kubelet stand-in sees the devices 4.4.0 would advertise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.support import RESOURCE, UPSTREAM_ENV, spawn_plugin, stop_process

from ix_device_plugin.hardware.simulated import default_uuid
from ix_device_plugin.standins.kubelet import KubeletStandIn

# The chips of the simulated node BI-V150:2: two boards of two chips; a board is named by its first chip.
CHIPS = [default_uuid(board, chip) for board in (0, 1) for chip in (0, 1)]
BOARDS = [default_uuid(board, 0) for board in (0, 1)]


async def test_split_board_from_the_environment_advertises_chips(
    kubelet: KubeletStandIn, plugin_dir: Path, short_dir: Path
) -> None:
    config = short_dir / "ix-config"
    config.write_text("flags:\n  splitboard: false\n")  # the variable beats the file, as in 4.4.0
    log = short_dir / "log"
    process = spawn_plugin(plugin_dir, "--config", str(config), log_file=log, env={"SPLIT_BOARD": "true"})
    try:
        view = await kubelet.wait_registered(RESOURCE, capacity=4, timeout=20)
        assert sorted(view.devices) == sorted(CHIPS)
        allocated = await kubelet.admit(RESOURCE, 1)
        assert allocated.envs["IX_VISIBLE_DEVICES"] in CHIPS  # one chip, not a board
    finally:
        stop_process(process)


async def test_a_config_of_iluvatars_plugin_is_served_with_a_warning_for_each_key_it_reads_differently(
    kubelet: KubeletStandIn, plugin_dir: Path, short_dir: Path
) -> None:
    config = short_dir / "ix-config"
    config.write_text(
        "Flags:\n  splitBoard: true\n"
        "sharing:\n  timeSlicing:\n    replicas: 1\n  mps:\n    replicas: 2\n"
        "logLevel: debug\n"
    )
    log = short_dir / "log"
    process = spawn_plugin(plugin_dir, "--config", str(config), log_file=log)
    try:
        view = await kubelet.wait_registered(RESOURCE, capacity=4, timeout=20)
        assert sorted(view.devices) == sorted(f"{chip}::0" for chip in CHIPS)  # replicas: 1 names replicas
        allocated = await kubelet.admit(RESOURCE, 2)
        replicas = allocated.envs["IX_REPLICA_DEVICES"].split(",")
        assert all(replica.endswith("::0") for replica in replicas)
        chips = [replica.removesuffix("::0") for replica in replicas]
        assert allocated.envs["IX_VISIBLE_DEVICES"].split(",") == chips
    finally:
        stop_process(process)
    text = log.read_text()
    for warning in (
        f"{config}: line 1: Flags: read as flags",
        f"{config}: line 2: flags.splitBoard: read as flags.splitboard",
        f"{config}: line 6: sharing.mps: read but not acted on",
        f"{config}: line 8: logLevel: unknown key, ignored",
    ):
        assert text.count(warning) == 1, text


async def test_an_empty_config_file_is_the_defaults(kubelet: KubeletStandIn, plugin_dir: Path, short_dir: Path) -> None:
    config = short_dir / "ix-config"
    config.write_text("")
    log = short_dir / "log"
    process = spawn_plugin(plugin_dir, "--config", str(config), log_file=log)
    try:
        view = await kubelet.wait_registered(RESOURCE, capacity=2, timeout=20)
        assert sorted(view.devices) == sorted(BOARDS)
    finally:
        stop_process(process)
    assert log.read_text().count(f"{config}: the file is empty: every setting takes its default") == 1


def list_json(*args: str, env: dict[str, str]) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("IX_") and k not in UPSTREAM_ENV}
    command = [sys.executable, "-m", "ix_device_plugin", "list", "--backend", "simulated", "--output", "json", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**clean, **env})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    report["stderr"] = result.stderr
    return report


def test_each_variable_and_flag_of_iluvatars_plugin_is_a_source(tmp_path: Path) -> None:
    config = tmp_path / "ix-config"
    config.write_text("flags:\n  usevolcano: false\n")
    env = {"SPLIT_BOARD": "1", "RESET_GPU": "f", "USE_VOLCANO": "T"}
    report = list_json("--config", str(config), "--reset_gpu=true", env=env)
    sources = {item["key"]: (item["value"], item["source"]) for item in report["config"]}  # type: ignore[attr-defined]
    assert sources["flags.splitboard"] == (True, "env SPLIT_BOARD")
    assert sources["flags.usevolcano"] == (True, "env USE_VOLCANO")
    assert sources["flags.reset_gpu"] == (True, "flag --reset_gpu")  # a flag beats a variable
    assert report["capacity"] == 4


def test_where_both_names_are_given_ours_wins_and_the_difference_is_said_once(tmp_path: Path) -> None:
    env = {"SPLIT_BOARD": "true", "IX_SPLITBOARD": "false"}
    report = list_json("--usevolcano", "--use-volcano=false", env=env)
    sources = {item["key"]: (item["value"], item["source"]) for item in report["config"]}  # type: ignore[attr-defined]
    assert sources["flags.splitboard"] == (False, "env IX_SPLITBOARD")
    assert sources["flags.usevolcano"] == (False, "flag --use-volcano")
    stderr = str(report["stderr"])
    assert stderr.count("IX_SPLITBOARD=false and SPLIT_BOARD=true (Iluvatar's plugin 4.4.0's name) differ") == 1
    assert stderr.count("--use-volcano=false and --usevolcano=true (Iluvatar's plugin 4.4.0's name) differ") == 1
