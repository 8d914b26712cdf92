"""Live config reload through the kubelet's `..data` symlink swap; bad edits change nothing."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import pytest
from helpers.support import RESOURCE, DaemonFactory, metric, spawn_plugin, stop_process
from helpers.waits import until

from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.tools.demo import ConfigMapDir

SEED = "flags:\n  splitboard: false\nsharing:\n  timeSlicing:\n    replicas: {replicas}\n"


@pytest.fixture
def configmap(short_dir: Path) -> ConfigMapDir:
    configmap = ConfigMapDir(short_dir / "ixconfig")
    configmap.write(SEED.format(replicas=0))
    return configmap


async def test_valid_change_reaches_the_kubelet_within_2s(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, configmap: ConfigMapDir
) -> None:
    daemon = await start_daemon("BI-V150:2", config_path=configmap.path, config_required=True)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    started = time.monotonic()
    configmap.write(SEED.format(replicas=4))
    await kubelet.wait_registered(RESOURCE, capacity=8, timeout=2)
    assert time.monotonic() - started < 2
    assert daemon.config.replicas == 4
    assert metric(daemon, "ix_device_plugin_config_reloads_total") == 1
    configmap.write("flags:\n  splitboard: true\n")
    view = await kubelet.wait_registered(RESOURCE, capacity=4, timeout=2)
    assert view.allocatable == 4


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("flags: 5\n", "line 1: flags: expected a mapping, got the value 5"),
        ("sharing:\n  timeSlicing:\n    replicas: four\n", "replicas: expected a whole number >= 0, got 'four'"),
        ("flags: [\n", "invalid YAML"),
        ("flags:\n  splitboard: 1\n", "line 2: flags.splitboard: expected true or false, got 1"),
    ],
)
async def test_broken_edit_keeps_the_last_good_state(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    configmap: ConfigMapDir,
    caplog: pytest.LogCaptureFixture,
    broken: str,
    message: str,
) -> None:
    configmap.write(SEED.format(replicas=4))
    daemon = await start_daemon("BI-V150:2", config_path=configmap.path, config_required=True)
    view = await kubelet.wait_registered(RESOURCE, capacity=8)
    updates = view.updates
    caplog.set_level(logging.ERROR, logger="ix_device_plugin.deviceplugin.daemon")
    configmap.write(broken)
    await until(lambda: metric(daemon, "ix_device_plugin_config_reload_failures_total") == 1, timeout=2)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(message in line and str(configmap.path) in line for line in errors), errors
    assert "keeping the last good configuration" in errors[0]
    assert view.capacity == 8 and view.allocatable == 8 and view.updates == updates
    assert daemon.config.replicas == 4 and daemon.registered
    # Seen again: logged again; fixed: applied.
    configmap.write(broken + "\n")
    await until(lambda: metric(daemon, "ix_device_plugin_config_reload_failures_total") == 2, timeout=2)
    configmap.write(SEED.format(replicas=2))
    await kubelet.wait_registered(RESOURCE, capacity=4, timeout=2)


async def test_resource_name_change_registers_anew(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, configmap: ConfigMapDir
) -> None:
    await start_daemon("BI-V100:2", config_path=configmap.path, config_required=True)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    configmap.write("sharing:\n  timeSlicing:\n    replicas: 2\n    renameByDefault: true\n")
    view = await kubelet.wait_registered(f"{RESOURCE}.shared", capacity=4, timeout=2)
    assert view.allocatable == 4
    assert kubelet.registrations[-1].resource_name == f"{RESOURCE}.shared"
    await kubelet.wait_for(lambda: not kubelet.resources[RESOURCE].connected, timeout=2)


async def test_in_place_rewrite_is_noticed(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    config = short_dir / "plain.yaml"
    config.write_text("flags:\n  splitboard: false\n")
    await start_daemon("BI-V150:1", config_path=config, config_required=True)
    await kubelet.wait_registered(RESOURCE, capacity=1)
    config.write_text("flags:\n  splitboard: true\n")
    await kubelet.wait_registered(RESOURCE, capacity=2, timeout=2)


async def test_default_config_path_appearing_later(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    configmap = ConfigMapDir(short_dir / "late")
    await start_daemon("BI-V100:1", config_path=configmap.path)
    await kubelet.wait_registered(RESOURCE, capacity=1)
    configmap.write(SEED.format(replicas=3))
    await kubelet.wait_registered(RESOURCE, capacity=3, timeout=2)


async def test_invalid_config_at_start_exits_1(plugin_dir: Path, short_dir: Path) -> None:
    bad = short_dir / "bad.yaml"
    bad.write_text("flags:\n  splitboard: maybe\n")
    log = short_dir / "log"
    process = spawn_plugin(plugin_dir, "--config", str(bad), log_file=log)
    try:
        assert process.wait(10) == 1
        assert f"{bad}: line 2: flags.splitboard: expected true or false, got 'maybe'" in log.read_text()
    finally:
        stop_process(process)


async def test_sighup_logs_a_bad_config_again(kubelet: KubeletStandIn, plugin_dir: Path, short_dir: Path) -> None:
    configmap = ConfigMapDir(short_dir / "ixconfig")
    configmap.write(SEED.format(replicas=2))
    log = short_dir / "log"
    process = spawn_plugin(plugin_dir, "--config", str(configmap.path), log_file=log)
    try:
        await kubelet.wait_registered(RESOURCE, capacity=4, timeout=10)
        configmap.write("sharing:\n  timeSlicing:\n    replicas: -3\n")
        await until(lambda: log.read_text().count("replicas: expected a whole number") == 1, timeout=3)
        process.send_signal(signal.SIGHUP)
        await until(lambda: log.read_text().count("replicas: expected a whole number") == 2, timeout=3)
        assert kubelet.capacity(RESOURCE) == 4 and process.poll() is None
    finally:
        stop_process(process)
