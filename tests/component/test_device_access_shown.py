"""Device access shown per node against the API-server stand-in: the label iluvatar.com/gpu.device-access, one
Warning Event GPUDeviceAccessMissing and the metric, decided from the NRI injector's status file and a real refused
open of the GPU device nodes (a device node on a tmpfs mounted nodev: the kernel refuses the open, as a container's
device cgroup does where the runtime gave the container no GPU).

And the agent keeps running where it cannot reach its GPUs, whatever flags.failOnInitError says: it shows what is
missing instead of restarting (the chart's privileged DaemonSet then takes the node, or in strict mode the node goes
without GPUs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.host_tools import require
from helpers.reset_support import node_events
from helpers.waits import stays, until

from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.core.deviceaccess import ACCESS_LABEL, MISSING_REASON
from ix_device_plugin.deviceaccess.service import METRIC, DeviceAccessReport
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.healing.events import NodeEvents
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.lazymetrics import Registry
from ix_device_plugin.settings.options import NodeOptions
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

NODE = "gpu-node-1"
FAST = Backoff(initial=0.05, cap=0.2)
NO_NRI = "unavailable: no NRI socket at /var/run/nri/nri.sock (stat /var/run/nri/nri.sock: no such file or directory)"


@pytest.fixture
def refused_dev() -> Iterator[Path]:
    """A dev root whose /dev/iluvatar0 and /dev/itrctl the kernel refuses to open (nodev tmpfs)."""
    require("needs root to mount a tmpfs and make device nodes" if os.geteuid() != 0 else None)
    root = Path(tempfile.mkdtemp(prefix="ix-nodev-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nodev,size=1m", "tmpfs", str(root)], check=True)
    try:
        (root / "dev").mkdir()
        for name in ("iluvatar0", "itrctl"):
            os.mknod(root / "dev" / name, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=False)
        root.rmdir()


@pytest.fixture
async def api(apiserver: ApiServerStandIn, tmp_path: Path) -> AsyncIterator[ApiConnection]:
    apiserver.add_node(NODE)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    connection = ApiConnection(settings_from({"NODE_NAME": NODE}, str(kubeconfig), "test"), FAST)
    yield connection
    await connection.close()


def status_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "injector" / "status"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def label(apiserver: ApiServerStandIn) -> str | None:
    node = apiserver.get("nodes", NODE)
    assert node is not None
    return (node["metadata"].get("labels") or {}).get(ACCESS_LABEL)


async def shown(options: NodeOptions, api: ApiConnection) -> Registry:
    """The report checked and its label and Event written; the metrics' registry."""
    writer = NodeEvents(api, NODE)
    registry = Registry()
    report = DeviceAccessReport(options, api, writer, registry)
    report.check()
    await report.label_node()
    await writer.flush(timeout=10)
    return registry


async def test_without_nri_the_node_is_labelled_for_the_privileged_daemonset_with_one_event(
    refused_dev: Path, api: ApiConnection, apiserver: ApiServerStandIn, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options = NodeOptions(
        dev_root=refused_dev, device_access="nri", device_access_fallback="privileged",
        nri_status=status_file(tmp_path, NO_NRI),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="ix_device_plugin.deviceaccess.service"):
        registry = await shown(options, api)
    assert label(apiserver) == "privileged"
    (event,) = node_events(apiserver, MISSING_REASON)
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == NODE
    assert event["message"].startswith("no GPU device nodes from the NRI injector: no NRI socket at /var/run/nri")
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert said == [f"device access: {event['message']}"]  # the one line, and the Event says the same
    samples = {value: registry.get_sample_value(METRIC, {"access": value}) for value in ("nri", "privileged", "none")}
    assert samples == {"nri": 0.0, "privileged": 1.0, "none": 0.0}


async def test_in_strict_mode_the_node_is_labelled_none(
    refused_dev: Path, api: ApiConnection, apiserver: ApiServerStandIn, tmp_path: Path
) -> None:
    options = NodeOptions(dev_root=refused_dev, device_access="nri", nri_status=status_file(tmp_path, NO_NRI))
    await shown(options, api)
    assert label(apiserver) == "none"
    (event,) = node_events(apiserver, MISSING_REASON)
    assert "strict mode forbids the privileged fallback" in event["message"]


async def test_devices_that_open_are_labelled_with_how_they_came_and_no_event(
    api: ApiConnection, apiserver: ApiServerStandIn, tmp_path: Path
) -> None:
    options = NodeOptions(dev_root=tmp_path, device_access="nri", nri_status=status_file(tmp_path, "registered\n"))
    await shown(options, api)
    assert label(apiserver) == "nri" and node_events(apiserver) == []


async def test_a_label_already_right_is_not_written_again(
    api: ApiConnection, apiserver: ApiServerStandIn, tmp_path: Path
) -> None:
    apiserver.set_node_labels(NODE, {ACCESS_LABEL: "runtime", "other": "kept"})
    await shown(NodeOptions(dev_root=tmp_path, device_access="runtime"), api)
    assert not [r for r in apiserver.requests if r.method == "PATCH"]
    apiserver.set_node_labels(NODE, {ACCESS_LABEL: "nri", "other": "kept"})
    await shown(NodeOptions(dev_root=tmp_path, device_access="runtime"), api)
    node = apiserver.get("nodes", NODE)
    assert node is not None and node["metadata"]["labels"] == {ACCESS_LABEL: "runtime", "other": "kept"}


async def test_a_refused_label_is_said_once_and_not_retried(
    api: ApiConnection, apiserver: ApiServerStandIn, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.refuse_writes("nodes", "metadata.labels", times=5)
    with caplog.at_level(logging.ERROR, logger="ix_device_plugin.deviceaccess.service"):
        await shown(NodeOptions(dev_root=tmp_path, device_access="runtime"), api)
    said = [r.getMessage() for r in caplog.records if "cannot label node" in r.getMessage()]
    assert len(said) == 1 and "features.deviceAccessLabel" in said[0]
    assert len([r for r in apiserver.requests if r.method == "PATCH"]) == 1


async def test_a_label_written_while_the_api_server_is_down_is_written_once_it_answers(
    api: ApiConnection, apiserver: ApiServerStandIn, tmp_path: Path
) -> None:
    await apiserver.refuse()
    report = DeviceAccessReport(NodeOptions(dev_root=tmp_path, device_access="runtime"), api, None, Registry())
    report.check()
    task = asyncio.create_task(report.run())
    await until(lambda: any(r.method == "GET" for r in apiserver.requests) or report.access is not None, timeout=10.0)
    await stays(lambda: label(apiserver) is None, for_=0.5, message="no label while the API server refuses")
    await apiserver.accept()
    await until(lambda: label(apiserver) == "runtime", timeout=10.0)
    assert not task.done()  # a node task runs until the agent stops
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_without_the_charts_word_nothing_is_shown(tmp_path: Path) -> None:
    report = DeviceAccessReport(NodeOptions(dev_root=tmp_path), None, None, Registry())
    assert report.check() is None and report.tasks() == {}


async def test_the_device_plugin_stays_up_without_its_gpus_registers_nothing_and_shows_why(
    refused_dev: Path,
    api: ApiConnection,
    apiserver: ApiServerStandIn,
    tmp_path: Path,
    start_daemon: Any,
    kubelet: KubeletStandIn,
) -> None:
    """flags.failOnInitError is true by default: without device access the agent would have exited and restarted for
    ever; it serves 0 GPUs and labels its Node instead."""
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kube")
    daemon = await start_daemon(
        backend_factory=lambda: SimulatedBackend("BI-V150:2", dev_root=refused_dev),
        kube=settings_from({"NODE_NAME": NODE}, str(kubeconfig), "test"),
        dev_root=refused_dev, device_access="nri", device_access_fallback="privileged",
        nri_status=status_file(tmp_path, NO_NRI), node_name=NODE,
    )  # fmt: skip
    await until(lambda: label(apiserver) == "privileged", timeout=10.0)
    assert not daemon.current.state.inventory.boards
    await until(lambda: len(node_events(apiserver, MISSING_REASON)) == 1, timeout=20.0)
    # A node task that ended would be down (and started again) within this time.
    await stays(lambda: daemon.live()[0] and not daemon.service.down(), for_=1.0, message="the daemon stays live")
    # It registers nothing: 0 GPUs registered would replace what another plugin serves (a kubelet 1.37+ asks the
    # newest endpoint); ready, so that a rollout of its DaemonSet goes on.
    assert not daemon.endpoint.serving and not kubelet.registrations
    ready, why = daemon.ready()
    assert ready and why.startswith("standby: no device access, registering nothing: no GPU device nodes from the NRI")


def test_options_default_to_nothing_shown() -> None:
    options = replace(NodeOptions())
    assert (options.device_access, options.device_access_fallback, options.device_access_label) == (None, "none", True)
