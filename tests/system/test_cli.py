"""The command line as an operator runs it: list, demo, --version, flags, env and log formats."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import spawn_plugin, stop_process
from helpers.waits import until_sync

from ix_device_plugin import __version__
from ix_device_plugin.settings.table import BY_FLAG, LIST, SETTINGS
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("IX_")}
    return subprocess.run(
        [sys.executable, "-m", "ix_device_plugin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
    )


def test_version() -> None:
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"ix-device-plugin {__version__}"


def test_demo_prints_the_seed_capacities() -> None:
    result = cli("demo")
    assert result.returncode == 0, result.stderr
    capacities = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("iluvatar.com/gpu:")]
    assert capacities[0::2] == ["iluvatar.com/gpu: 2", "iluvatar.com/gpu: 4", "iluvatar.com/gpu: 8"]
    assert "device /dev/iluvatar0 (rw)" in result.stdout
    assert "env IX_VISIBLE_DEVICES=GPU-" in result.stdout


def test_demo_json() -> None:
    result = cli("demo", "--output", "json", "--simulated-devices", "BI-V100:3")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [s["capacity"] for s in report["scenarios"]] == [3, 3, 12]
    assert all(s["allocatable"] == s["capacity"] for s in report["scenarios"])


def test_list_json_shows_sources_and_devices(tmp_path: Path) -> None:
    config = tmp_path / "ix-config"
    config.write_text("sharing:\n  timeSlicing:\n    replicas: 4\n")
    result = cli(
        "list",
        "--backend",
        "simulated",
        "--simulated-devices",
        "BI-V150:2",
        "--config",
        str(config),
        "--splitboard",
        "--output",
        "json",
        env={"IX_RESOURCE_NAME": "example.com/ix"},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["resource_name"], report["capacity"]) == ("example.com/ix", 16)
    sources = {item["key"]: item["source"] for item in report["config"]}
    assert sources == {
        "resourceName": "env IX_RESOURCE_NAME",
        "flags.splitboard": "flag --splitboard",
        "flags.failOnInitError": "default",
        "flags.reset_gpu": "default",
        "flags.usevolcano": "default",
        "flags.deviceListStrategy": "default",
        "sharing.timeSlicing.replicas": f"file {config}",
        "sharing.timeSlicing.renameByDefault": "default",
        "sharing.timeSlicing.failRequestsGreaterThanOne": "default",
        "health.selfHealing": "default",
        "health.reset": "default",
        "health.operator": "default",
        "health.ignore": "default",
        "health.resetLimit": "default",
        "health.resetWindow": "default",
        "health.resetDiagnostic": "default",
        "health.resetDiagnosticTimeout": "default",
    }
    assert [len(board["chips"]) for board in report["boards"]] == [2, 2]


def test_list_text_names_unhealthy_chips(tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text("boards:\n  - product: BI-V150\n    chips:\n      - {}\n      - health: [ECC, PCIE]\n")
    result = cli("list", "--backend", "simulated", "--simulated-devices", str(devices))
    assert result.returncode == 0, result.stderr
    assert "Unhealthy: ECC; PCIE" in result.stdout
    assert "Capacity:\n  iluvatar.com/gpu: 1\nAllocatable:\n  iluvatar.com/gpu: 0" in result.stdout


def test_list_shows_each_chips_health_story_as_the_running_plugin_tells_it(tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text("boards:\n  - product: BI-V100\n  - product: BI-V100\n    chips:\n      - xids: [48]\n")
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    plugin = spawn_plugin(
        plugin_dir, "--simulated-devices", str(devices), "--self-healing", "true", "--pod-resources-socket", "off"
    )
    try:
        args = ("list", "--backend", "simulated", "--simulated-devices", str(devices))

        def the_story() -> str | None:
            shown = cli(*args, "--device-plugin-path", str(plugin_dir)).stdout
            return shown if "held by no one can tell" in shown else None

        shown = until_sync(the_story, timeout=20, interval=0.2, message="`list` telling the health story")
    finally:
        stop_process(plugin)
    assert "Self-healing: on (as of " in shown
    assert (
        "health story: out of service, to be reset once free: XID 48; waiting to be reset: held by no one can tell "
        "whether a container holds it: the pod-resources socket is turned off"
    ) in shown
    assert shown.count("health story: in service") == 1
    alone = cli(*args, "--device-plugin-path", str(tmp_path / "elsewhere"))
    assert "Self-healing: no health story (the agent is not running on this node" in alone.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--simulated-devices", "BI-V999"], "unknown product 'BI-V999'"),
        (["--simulated-devices", "BI-V150:0"], "count in 'BI-V150:0' must be a whole number from 1 to 256"),
        (["--simulated-devices", "/nonexistent/devices.yaml"], "does not exist"),
        (["--config", "/nonexistent/ix-config"], "/nonexistent/ix-config: cannot read config file"),
    ],
)
def test_list_errors_are_clear(args: list[str], message: str) -> None:
    result = cli("list", "--backend", "simulated", *args)
    assert result.returncode == 1
    assert message in result.stderr


BAD_VALUES = [
    (["--replicas", "-2"], {}, "flag --replicas: expected a whole number >= 0"),
    ([], {"IX_REPLICAS": "-2"}, "environment variable IX_REPLICAS: expected a whole number >= 0"),
    (["--health-address", "nonsense"], {}, "flag --health-address: expected HOST:PORT, :PORT or off"),
    (["--health-address", ":99999"], {}, "flag --health-address: expected HOST:PORT"),
    ([], {"IX_HEALTH_ADDRESS": ":²"}, "environment variable IX_HEALTH_ADDRESS: expected HOST:PORT"),
    ([], {"IX_LOG_LEVEL": "trace"}, "environment variable IX_LOG_LEVEL: expected one of debug, info"),
    ([], {"IX_LOG_FORMAT": "xml"}, "environment variable IX_LOG_FORMAT: expected one of text, json"),
    ([], {"IX_BACKEND": "foo"}, "environment variable IX_BACKEND: expected one of ixml, simulated"),
    (["--health-interval", "1e-300"], {}, "flag --health-interval: expected a number of seconds from 0.1"),
    (["--health-interval", "nan"], {}, "flag --health-interval: expected a number of seconds from 0.1"),
    ([], {"IX_HEALTH_INTERVAL": "inf"}, "environment variable IX_HEALTH_INTERVAL: expected a number of seconds"),
    (["--health-interval", "soon"], {}, "flag --health-interval: expected a number of seconds, got 'soon'"),
    (["--backend-timeout", "0"], {}, "flag --backend-timeout: expected a number of seconds from 0.1"),
    ([], {"IX_DISABLE_HEALTHCHECKS": "Fan"}, "environment variable IX_DISABLE_HEALTHCHECKS: unknown check 'Fan'"),
]
BY_ENV = {setting.env: setting for setting in SETTINGS}


def _used_by_list(args: list[str], env: dict[str, str]) -> bool:
    setting = BY_FLAG[args[0]] if args else BY_ENV[next(iter(env))]
    return setting.used_by(LIST)


@pytest.mark.parametrize(
    ("command", "args", "env", "message"),
    [("run", *case) for case in BAD_VALUES] + [("list", *case) for case in BAD_VALUES if _used_by_list(*case[:2])],
)
def test_bad_flags_and_variables_are_one_line_each_and_exit_2(
    command: str, args: list[str], env: dict[str, str], message: str
) -> None:
    result = cli(command, *args, env=env)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_demo_refuses_flags_it_does_not_use() -> None:
    result = cli("demo", "--replicas", "3")
    assert result.returncode == 2
    assert (
        "ix-device-plugin demo: error: demo does not use --replicas (used by run, list, dra, list --dra)"
        in result.stderr
    )
    result = cli("demo", "--no-such-flag")
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr


def test_dra_refuses_a_device_plugin_flag_naming_it() -> None:
    result = cli("dra", "--use-volcano", "true", "--node-name", "node-a")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "ix-device-plugin dra: error: dra does not use --use-volcano (a device plugin setting)"
    )
    result = cli("list", "--dra", "--fail-requests-greater-than-one=true")
    assert result.returncode == 2
    assert "list --dra does not use --fail-requests-greater-than-one" in result.stderr
    result = cli("run", "--kubelet-registrar-directory-path", "/x")
    assert result.returncode == 2
    assert "run does not use --kubelet-registrar-directory-path (a DRA setting)" in result.stderr


def test_list_without_gpus_suggests_the_simulated_backend(tmp_path: Path) -> None:
    result = cli("list", "--ixml-library", str(tmp_path / "libixml.so"))
    assert result.returncode == 1
    assert "try --backend simulated" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_simulated_file_names_the_key(tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text("boards:\n  - product: BI-V150\n    chips:\n      - health: [Hot]\n")
    result = cli("list", "--backend", "simulated", "--simulated-devices", str(devices))
    assert result.returncode == 1
    assert f"{devices}: boards[0].chips[0].health: unknown error 'Hot'" in result.stderr


def test_json_logs_are_one_object_per_line(tmp_path: Path) -> None:
    log = tmp_path / "log"
    missing = tmp_path / "no-such-dir"
    daemon = spawn_plugin(missing, "--log-format", "json", log_file=log)
    try:
        assert daemon.wait(30) == 1
    finally:
        stop_process(daemon)
    entries = [json.loads(line) for line in log.read_text().strip().splitlines()]
    assert all({"time", "level", "logger", "msg"} <= set(entry) for entry in entries)
    errors = [entry for entry in entries if entry["level"] == "error"]
    assert f"device plugin directory {missing} does not exist" in errors[-1]["msg"]


async def test_list_shows_live_figures_and_which_pod_holds_each_device(short_dir: Path) -> None:
    base = ("list", "--backend", "simulated", "--simulated-devices", "BI-V150:2", "--splitboard")
    socket_path = short_dir / "pod-resources" / "kubelet.sock"
    alone = json.loads((await asyncio.to_thread(cli, *base, "--output", "json")).stdout)
    device_ids = [device["id"] for device in alone["devices"]]
    assert alone["pod_resources_read"] is False
    chip = alone["boards"][0]["chips"][0]
    assert chip["telemetry"]["mem_total_mib"] == chip["memory_mib"]
    assert {"temperature_c", "power_w", "gpu_utilization", "mem_used_mib"} <= set(chip["telemetry"])

    standin = PodResourcesStandIn(socket_path)
    await standin.start()
    try:
        standin.pods = {("ml", "trainer-0"): {"main": {"iluvatar.com/gpu": device_ids[:1], "other.com/x": ["y"]}}}
        pod_flag = ("--pod-resources-socket", str(socket_path))
        report = json.loads((await asyncio.to_thread(cli, *base, *pod_flag, "--output", "json")).stdout)
        text = (await asyncio.to_thread(cli, *base, *pod_flag)).stdout
    finally:
        await standin.stop()
    held = {device["id"]: device["held_by"] for device in report["devices"]}
    assert held[device_ids[0]] == {"namespace": "ml", "pod": "trainer-0", "container": "main"}
    assert all(held[device_id] is None for device_id in device_ids[1:])
    assert f"{device_ids[0]:<46} Healthy   numa ?  held by ml/trainer-0 (main)" in text
    assert f"{device_ids[1]:<46} Healthy   numa ?  free" in text
    assert "flags.splitboard                                 true" in text


async def test_dra_says_once_which_variables_and_config_keys_it_does_not_use(short_dir: Path) -> None:
    config = short_dir / "ix-config"
    config.write_text("flags:\n  failOnInitError: true\nsharing:\n  timeSlicing:\n    renameByDefault: true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("IX_")}
    env |= {"IX_RESET_GPU": "true", "IX_USE_VOLCANO": "true", "NODE_NAME": "node-a", "PYTHONUNBUFFERED": "1"}
    async with ApiServerStandIn() as api:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ix_device_plugin", "dra", "--backend", "simulated", "--config", str(config)),
            *("--kubeconfig", str(api.write_kubeconfig(short_dir / "kubeconfig")), "--dev-root", str(short_dir)),
            *("--kubelet-registrar-directory-path", str(short_dir / "registry"), "--health-address", "off"),
            *("--node-feature-dir", str(short_dir / "features.d"), "--pod-resources-socket", "off"),
            *("--kubelet-plugins-directory-path", str(short_dir / "plugins"), "--cdi-spec-dir", str(short_dir / "cdi")),
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert process.stderr is not None
        lines: list[str] = []
        try:
            async with asyncio.timeout(30):
                while not lines or "ready in" not in lines[-1]:
                    lines.append((await process.stderr.readline()).decode())
                    assert lines[-1], "".join(lines)
        finally:
            process.terminate()
            await process.wait()
    log = "".join(lines)
    assert log.count("environment variables dra does not use") == 1
    assert (
        "environment variables dra does not use, ignored: IX_RESET_GPU (a device plugin setting), "
        "IX_USE_VOLCANO (a device plugin setting)"
    ) in log
    assert log.count(f"{config}: keys dra does not use, ignored: sharing.timeSlicing.renameByDefault (line 5)") == 1


def test_template_prints_the_slices_and_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    result = cli("template", "--product", "BI-V150", "--boards", "2", "--output", "json")
    assert result.returncode == 0, result.stderr
    assert [item["kind"] for item in json.loads(result.stdout)["items"]] == ["ResourceSlice", "ResourceSlice"]
    config = tmp_path / "ix-config"
    config.write_text("flags: [")
    for argv, said in [
        (["--product", "XYZ", "--boards", "2"], "--product: unknown product 'XYZ' (known: BI-V150, "),
        (["--product", "BI-V150", "--boards", "-1"], "--boards: expected a whole number from 1 to 256, got '-1'"),
        (["--product", "BI-V150", "--boards", "2", "--config", str(config)], f"{config}: "),
    ]:
        result = cli("template", *argv)
        assert (result.returncode, result.stdout) == (2, ""), argv
        assert result.stderr.startswith(f"ix-device-plugin template: error: {said}"), result.stderr
        assert "Traceback" not in result.stderr
