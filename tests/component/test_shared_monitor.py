"""Both front ends on one hardware monitor: what the device plugin learns of a chip, the DRA driver learns too."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers.dra_support import DraNode
from helpers.support import RESOURCE, DaemonFactory, make_dev_root

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.dra.slices import UNHEALTHY_TAINT
from ix_device_plugin.hardware.ixml import IxmlBackend
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

TWO_CHIPS = (
    'device uuid=GPU-s0 name="Iluvatar BI-V100" minor=0 bus=00000000:8A:00.0\n'
    'device uuid=GPU-s1 name="Iluvatar BI-V100" minor=1 bus=00000000:8B:00.0\n'
)


@pytest.fixture
async def apiserver() -> AsyncIterator[ApiServerStandIn]:
    async with ApiServerStandIn() as server:
        yield server


@pytest.fixture
def double_conf(conf: Path) -> Path:
    """The C double's device file (the conf fixture's) with this file's two chips, GPU-s0 and GPU-s1."""
    conf.write_text(TWO_CHIPS)
    return conf


def dra_node(short_dir: Path, apiserver: ApiServerStandIn) -> DraNode:
    """A DRA node of its own beside the device plugin's directories."""
    (short_dir / "dra").mkdir()
    return DraNode(short_dir / "dra", apiserver)


def library_copy(libs: dict[str, Path], directory: Path) -> Path:
    """A copy of the full double: loaded apart from other copies, so each front end gets every event once."""
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(libs["full"], directory / "libixml.so"))


async def test_an_xid_reaches_listandwatch_and_the_resource_slice(
    libs: dict[str, Path],
    double_conf: Path,
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    short_dir: Path,
    apiserver: ApiServerStandIn,
) -> None:
    make_dev_root(short_dir, [0, 1])
    plugin_library = library_copy(libs, short_dir / "plugin-lib")
    daemon = await start_daemon(
        "BI-V100:2", backend_factory=lambda: IxmlBackend(str(plugin_library), dev_root=short_dir)
    )
    await kubelet.wait_registered(RESOURCE, capacity=2)
    node = dra_node(short_dir, apiserver)
    make_dev_root(node.root, [0, 1])
    driver_library = library_copy(libs, short_dir / "driver-lib")
    driver = await node.start(backend_factory=lambda: IxmlBackend(str(driver_library), dev_root=node.root))
    try:
        await node.wait_slice(lambda devices: len(devices) == 2 and not any("taints" in d for d in devices.values()))
        started = time.monotonic()
        with double_conf.open("a") as stream:
            stream.write("xid=1,79\n")
        await kubelet.wait_for(lambda: kubelet.resources[RESOURCE].devices.get("GPU-s1") == UNHEALTHY, timeout=3)
        await node.wait_slice(lambda devices: "taints" in devices.get("gpu-1", {}), timeout=3)
        elapsed = time.monotonic() - started
        assert kubelet.resources[RESOURCE].devices["GPU-s0"] == HEALTHY
        taint = node.slice_devices()["gpu-1"]["taints"][0]
        assert taint == {"key": UNHEALTHY_TAINT, "effect": "NoSchedule", "value": "XID-79"}
        assert "taints" not in node.slice_devices()["gpu-0"]
        assert elapsed < 3  # a hang guard; both see it within milliseconds (the bench measures it)
        assert daemon.inventory.statuses()["GPU-s1"].xids == driver.inventory.statuses()["GPU-s1"].xids == {79}
    finally:
        await node.stop_all()


async def test_the_dra_driver_honours_ix_disable_healthchecks(
    libs: dict[str, Path],
    double_conf: Path,
    short_dir: Path,
    apiserver: ApiServerStandIn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin.hardware.monitor")
    node = dra_node(short_dir, apiserver)
    make_dev_root(node.root, [0, 1])
    library = library_copy(libs, short_dir / "lib")
    double_conf.write_text(TWO_CHIPS.replace("minor=1 ", "minor=1 health=0x10 "))  # ECC on chip 1
    driver = await node.start(
        backend_factory=lambda: IxmlBackend(str(library), dev_root=node.root),
        ignored_health_errors=frozenset({"ECC", "XID 79"}),
    )
    try:
        await node.wait_slice(lambda devices: len(devices) == 2)
        with double_conf.open("a") as stream:
            stream.write("xid=0,79\nxid=0,48\n")
        await node.wait_slice(lambda devices: "taints" in devices["gpu-0"], timeout=3)  # XID 48 is not ignored
        assert node.slice_devices()["gpu-0"]["taints"][0]["value"] == "XID-48"
        assert "taints" not in node.slice_devices()["gpu-1"]  # ECC is ignored
        assert any("XID 79 on GPU-s0 ignored" in record.getMessage() for record in caplog.records)
        assert driver.inventory.statuses()["GPU-s0"].xids == {48}
    finally:
        await node.stop_all()


def _dra_process(node: DraNode, *flags: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IX_")}
    command = [
        sys.executable, "-m", "ix_device_plugin", "dra",
        "--backend", "ixml", "--ixml-library", str(node.root / "missing" / "libixml.so"),
        "--node-name", node.node, "--kubeconfig", str(node.kubeconfig),
        "--kubelet-registrar-directory-path", str(node.root / "registry"),
        "--kubelet-plugins-directory-path", str(node.root / "plugins"),
        "--cdi-spec-dir", str(node.cdi_dir), "--health-address", "off", "--node-feature-dir", "off", *flags,
    ]  # fmt: skip
    return subprocess.Popen(command, stderr=subprocess.PIPE, env=env)


async def test_dra_with_fail_on_init_error_false_runs_on_a_node_whose_library_fails(
    short_dir: Path, apiserver: ApiServerStandIn
) -> None:
    node = dra_node(short_dir, apiserver)
    process = _dra_process(node, "--fail-on-init-error", "false")
    try:
        await node.wait_slice(lambda devices: node.slice() is not None and devices == {}, timeout=20)
        assert process.poll() is None  # still running, with 0 GPUs
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 10) == 0
        assert time.monotonic() - started < 2.5
    finally:
        process.kill()
        _, stderr = process.communicate(timeout=10)
    text = stderr.decode()
    assert "continuing with 0 GPUs" in text and "Traceback" not in text


async def test_dra_fails_at_start_when_the_library_fails_by_default(
    short_dir: Path, apiserver: ApiServerStandIn
) -> None:
    node = dra_node(short_dir, apiserver)
    process = _dra_process(node)
    try:
        assert await asyncio.to_thread(process.wait, 20) == 1
    finally:
        process.kill()
        _, stderr = process.communicate(timeout=10)
    text = stderr.decode()
    assert "no GPUs could be discovered" in text and "flags.failOnInitError" in text
    assert "Traceback" not in text
    assert node.slice() is None


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_the_kubelet_gets_device_health_within_a_second_of_an_xid_and_again_when_quiet(
    version: str,
    libs: dict[str, Path],
    double_conf: Path,
    short_dir: Path,
    apiserver: ApiServerStandIn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("ix_device_plugin.dra.health.RESEND_INTERVAL", 0.5)
    node = dra_node(short_dir, apiserver)
    make_dev_root(node.root, [0, 1])
    library = library_copy(libs, short_dir / "lib")
    driver = await node.start(backend_factory=lambda: IxmlBackend(str(library), dev_root=node.root))
    kubelet = await node.kubelet(driver)
    watch = await kubelet.watch_health(version)
    try:
        await watch.wait_for(lambda w: len(w.devices) == 2)
        assert watch.devices == {"gpu-0": ("HEALTHY", ""), "gpu-1": ("HEALTHY", "")}
        first = watch.messages[0][1].devices[0]
        assert (first.device.pool_name, first.health_check_timeout_seconds) == (node.node, 60)
        injected = asyncio.get_running_loop().time()
        with double_conf.open("a") as stream:
            stream.write("xid=1,79\n")
        await watch.wait_for(lambda w: w.devices["gpu-1"] == ("UNHEALTHY", "XID 79"), timeout=3)
        arrival = next(t for t, m in watch.messages if any(d.health == watch.pb2.UNHEALTHY for d in m.devices))
        assert arrival - injected < 1.0
        count = len(watch.messages)
        await watch.wait_for(lambda w: len(w.messages) >= count + 2, timeout=3)  # sent again while quiet
        assert watch.devices["gpu-0"] == ("HEALTHY", "")
    finally:
        await watch.close()
        await kubelet.close()
        await node.stop_all()
