"""Socket paths on a kubelet whose directories are as long as MicroK8s's: a real plugin process with a real pod UID
serves there, and the rules for sockets left by other pods know the names earlier releases gave them (the whole pod
UID in the name). A path that cannot fit is one clear line at start."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers.dra_support import DraNode, answer
from helpers.support import RESOURCE, DaemonFactory, spawn_plugin, stop_process
from helpers.waits import until

from ix_device_plugin.deviceplugin.endpoint import plugin_socket
from ix_device_plugin.dra.registration import dra_socket, registration_socket
from ix_device_plugin.kubelet.sockets import PATH_LIMIT
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

MICROK8S_ROOT = "/var/snap/microk8s/common/var/lib/kubelet"
MICROK8S_DEVICE_PLUGINS = f"{MICROK8S_ROOT}/device-plugins"
POD_UID = "7c4b2e1a-93f0-4d2b-8a6e-1f0c9d3b5e27"  # as the downward API gives it
EARLIER_POD_UID = "0b1d0000-0000-4000-8000-000000000001"


def dir_of_length(parent: Path, length: int) -> Path:
    """A new directory under parent whose absolute path has exactly length bytes."""
    path = parent / ("d" * (length - len(str(parent)) - 1))
    path.mkdir()
    assert len(str(path).encode()) == length
    return path


@pytest.fixture
def microk8s_dir(short_dir: Path) -> Path:
    """A device-plugin directory whose path is as long as MicroK8s's."""
    return dir_of_length(short_dir, len(MICROK8S_DEVICE_PLUGINS))


@pytest.fixture
async def microk8s_kubelet(microk8s_dir: Path) -> AsyncIterator[KubeletStandIn]:
    standin = KubeletStandIn(microk8s_dir)
    await standin.start()
    yield standin
    await standin.stop()


async def test_a_plugin_process_with_a_pod_uid_serves_from_a_directory_as_long_as_microk8s(
    microk8s_kubelet: KubeletStandIn, microk8s_dir: Path, short_dir: Path
) -> None:
    log = short_dir / "log"
    process = spawn_plugin(microk8s_dir, log_file=log, env={"POD_UID": POD_UID})
    try:
        await microk8s_kubelet.wait_registered(RESOURCE, capacity=2, timeout=15)
        name = plugin_socket(microk8s_dir, POD_UID).name
        assert microk8s_kubelet.endpoints(RESOURCE) == [name]
        assert len(str(microk8s_dir / name)) <= PATH_LIMIT
        device = next(iter(microk8s_kubelet.resources[RESOURCE].devices))
        response = await microk8s_kubelet.allocate(RESOURCE, [[device]])
        assert len(response.container_responses) == 1 and response.container_responses[0].devices
    finally:
        stop_process(process)
    assert process.returncode == 0, log.read_text()


def test_a_device_plugin_path_too_long_for_its_socket_is_one_clear_line_at_start(short_dir: Path) -> None:
    directory = dir_of_length(short_dir, PATH_LIMIT - len("/iluvatar-gpu.sock") + 1)
    log = short_dir / "log"
    process = spawn_plugin(directory, log_file=log)
    try:
        assert process.wait(20) == 1
    finally:
        stop_process(process)
    said = log.read_text()
    path = directory / "iluvatar-gpu.sock"
    assert (
        f"cannot serve the kubelet at {path}: the path has {PATH_LIMIT + 1} bytes, and a unix socket's path is at "
        f"most {PATH_LIMIT}; mount the kubelet's device-plugin directory (/var/lib/kubelet/device-plugins on the "
        "host) at a shorter path and name it with --device-plugin-path" in said
    )
    assert "Traceback" not in said and not path.exists()


@pytest.mark.parametrize("name", [f"iluvatar-gpu-{EARLIER_POD_UID}.sock", "iluvatar-gpu-0b1d0000.sock"])
async def test_a_dead_socket_of_an_earlier_or_this_release_is_removed_by_the_next_pod(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, plugin_dir: Path, name: str
) -> None:
    dead = plugin_dir / name
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(dead))  # bound, never served again: what kill -9 leaves
    daemon = await start_daemon(pod_uid=POD_UID)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    assert not dead.exists() and daemon.endpoint.path.is_socket()


async def test_a_socket_left_by_a_pod_killed_while_this_one_served_is_removed_as_this_one_stops(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, plugin_dir: Path
) -> None:
    """A pod deleted as its container started may lose its SIGTERM and be killed 30 s later, its socket in place:
    the pods that still run when the plugin is uninstalled are the last that can remove it. One that answers stays."""
    daemon = await start_daemon(pod_uid=POD_UID)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    dead, live = plugin_dir / "iluvatar-gpu-0b1d0000.sock", plugin_dir / "iluvatar-gpu-0b1d0001.sock"
    with socket.socket(socket.AF_UNIX) as left, socket.socket(socket.AF_UNIX) as serving:
        left.bind(str(dead))  # bound, never served again: what kill -9 leaves
        serving.bind(str(live))
        serving.listen()  # another pod, still stopping
        await daemon.shutdown()
        assert not dead.exists() and not daemon.endpoint.path.exists() and live.is_socket()


async def test_a_live_socket_named_by_an_earlier_release_is_left_to_its_pod(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, plugin_dir: Path
) -> None:
    live = plugin_dir / f"iluvatar-gpu-{EARLIER_POD_UID}.sock"
    with socket.socket(socket.AF_UNIX) as serving:
        serving.bind(str(live))
        serving.listen()  # answers: the earlier release's pod still serves the node
        daemon = await start_daemon(pod_uid=POD_UID)
        await kubelet.wait_registered(RESOURCE, capacity=2)
        await until(lambda: daemon.endpoint.path.name in kubelet.endpoints(RESOURCE))
        assert live.is_socket()


@pytest.fixture
async def api() -> AsyncIterator[ApiServerStandIn]:
    async with ApiServerStandIn() as server:
        yield server


async def test_a_dra_driver_with_a_pod_uid_serves_a_kubelet_root_as_long_as_microk8s(
    short_dir: Path, api: ApiServerStandIn
) -> None:
    node = DraNode(dir_of_length(short_dir, len(MICROK8S_ROOT)), api)
    try:
        driver = await node.start(pod_uid=POD_UID)
        assert driver.registrar_socket == registration_socket(node.root / "plugins_registry", POD_UID)
        assert driver.endpoint == dra_socket(node.root / "plugins", POD_UID)
        assert len(str(driver.registrar_socket)) <= PATH_LIMIT and len(str(driver.endpoint)) <= PATH_LIMIT
        await node.wait_slice(lambda devices: len(devices) == 6)
        kubelet = await node.kubelet(driver)  # dials the registration socket, then the endpoint GetInfo names
        assert kubelet.info is not None and kubelet.info.endpoint == str(driver.endpoint)
        claim = node.claim("one-gpu", ["gpu-1"])
        assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
        await kubelet.close()
    finally:
        await node.stop_all()
