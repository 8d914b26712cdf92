"""Two pods of the DRA driver on one node, as a rolling update runs them (maxSurge 1, maxUnavailable 0): one
publishes the node's ResourceSlices, the other waits on standby and takes over when the first stops or dies;
the sockets, the checkpoint's lock and the slices stay whole through it.

The drivers run in-process or as processes of their own (for real signals), against the API server stand-in.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.dra_support import DraNode
from helpers.waits import stays, until
from prometheus_client.parser import text_string_to_metric_families

from ix_device_plugin.dra.claimlocks import LOCK_FILE
from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.dra.driver import DraDriver
from ix_device_plugin.dra.registration import registration_socket
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.apiserver import ApiServerStandIn

WRITES = {"POST", "PUT", "PATCH", "DELETE"}
SAMPLE = 0.05  # seconds between looks at the node's slices


def slice_writes(api: ApiServerStandIn) -> int:
    """The writes to ResourceSlices the API server has received so far."""
    return sum(1 for request in api.requests if request.method in WRITES and "/resourceslices" in request.path)


async def settled(api: ApiServerStandIn, quiet: float = 0.5, timeout: float = 5.0) -> int:
    """The count of slice writes once none came for quiet seconds (a publication of several slices is over)."""
    async with asyncio.timeout(timeout):
        while True:
            count = slice_writes(api)
            await asyncio.sleep(quiet)
            if slice_writes(api) == count:
                return count


def unshared(devices: dict[str, dict[str, Any]]) -> bool:
    """The old pod's content: 4 chips and 2 boards, none shared."""
    return len(devices) == 6 and not any(d.get("allowMultipleAllocations") for d in devices.values())


def shared(devices: dict[str, dict[str, Any]]) -> bool:
    """The new pod's content (replicas 2): every device shared."""
    return bool(devices) and all(d.get("allowMultipleAllocations") for d in devices.values())


class SliceSampler:
    """Looks at the node's slices every SAMPLE seconds: the longest time they were missing."""

    def __init__(self, node: DraNode) -> None:
        self.node = node
        self.longest_gap = 0.0
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SliceSampler:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _sample(self) -> None:
        missing_since: float | None = None
        while True:
            now = time.monotonic()
            self.samples += 1
            if self.node.slice() is None:
                missing_since = now if missing_since is None else missing_since
                self.longest_gap = max(self.longest_gap, now - missing_since)
            else:
                missing_since = None
            await asyncio.sleep(SAMPLE)


def metric(driver: DraDriver, name: str) -> float:
    for family in text_string_to_metric_families(driver.metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no metric {name}")


# ------------------------------------------------------------------ one publisher, in-process


async def test_two_pods_with_different_config_overlap_with_one_writer_and_hand_over_at_the_stop(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin")
    old = await node.start(pod_uid="pod-old", health_address="127.0.0.1:0")
    await node.wait_slice(unshared)
    kubelets = [await node.kubelet(old)]
    new = await node.start(pod_uid="pod-new", config=Config(replicas=2), health_address="127.0.0.1:0")
    kubelets.append(await node.kubelet(new))
    before = slice_writes(api)
    async with SliceSampler(node) as sampler:
        # both pods running, each with its own content
        await stays(lambda: slice_writes(api) == before, for_=2, message="a write while both pods ran")
        assert unshared(node.slice_devices())
        assert (old.node.role.held, new.node.role.held) == (True, False)
        assert "standby: another pod holds" in caplog.text
        assert "(publishing the ResourceSlices of node node-a)" in caplog.text
        assert new._ready() == (
            True,
            "registered; standby: another pod of this driver publishes the slices of node node-a",
        )
        assert old._ready()[0] and "standby" not in old._ready()[1]
        assert (
            metric(old, "ix_device_plugin_dra_slice_publisher"),
            metric(new, "ix_device_plugin_dra_slice_publisher"),
        ) == (1, 0)
        stopped = time.monotonic()
        await node.stop(old)  # what SIGTERM does
        await node.wait_slice(shared, timeout=3)
        took = time.monotonic() - stopped
        assert new.node.role.held and metric(new, "ix_device_plugin_dra_slice_publisher") == 1
        at_rest = await settled(api)
        await stays(lambda: slice_writes(api) == at_rest, for_=1, message="a write at rest")
    assert sampler.longest_gap == 0 and sampler.samples > 40
    assert took < 1.0
    assert "on standby: publishing the ResourceSlices of node node-a" in caplog.text
    assert new.publisher is not None and new.publisher.repairs == 0
    for kubelet in kubelets:
        await kubelet.close()


async def test_the_standby_writes_nothing_while_the_publisher_repairs_another_writers_edit(
    node: DraNode, api: ApiServerStandIn
) -> None:
    old = await node.start(pod_uid="pod-old")
    await node.wait_slice(unshared)
    new = await node.start(pod_uid="pod-new", config=Config(replicas=2))
    await api.watching("resourceslices", count=2)  # the publisher's and the standby's
    stored = node.slice()
    assert stored is not None
    stored["spec"]["devices"] = stored["spec"]["devices"][:1]
    before = slice_writes(api)
    api.put("resourceslices", stored)  # someone else's edit
    await node.wait_slice(unshared, timeout=2)  # put back by the publisher, with its content
    await settled(api)
    assert slice_writes(api) - before == len(api.objects("resourceslices"))  # one repair: each slice of the pool
    assert old.publisher is not None and old.publisher.repairs == 1
    assert new.publisher is not None and new.publisher.published is None and new.publisher.repairs == 0


async def test_a_replaced_role_lock_stops_the_publisher_before_another_pod_takes_it(node: DraNode) -> None:
    old = await node.start(pod_uid="pod-old")
    await node.wait_slice(unshared)
    lock = old.node.role.path
    lock.unlink()  # someone removed the lock file: a new pod would lock a new file
    new = await node.start(pod_uid="pod-new", config=Config(replicas=2))
    await node.wait_slice(shared, timeout=4)
    await until(
        lambda: not old.node.role.held and new.node.role.held,
        timeout=5,
        message="the new pod holding the role, not the old",
    )
    assert shared(node.slice_devices())  # the old pod stopped writing, the war did not start


# ------------------------------------------------------------------ one publisher, as processes


def spawn_driver(node: DraNode, pod_uid: str, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    """`ix-device-plugin dra` as a process of its own on the node's simulated boards."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IX_")}
    command = [
        sys.executable, "-m", "ix_device_plugin", "dra", "--backend", "simulated",
        "--simulated-devices", str(node.devices_file), "--node-name", node.node, "--kubeconfig", str(node.kubeconfig),
        "--kubelet-registrar-directory-path", str(node.root / "plugins_registry"),
        "--kubelet-plugins-directory-path", str(node.root / "plugins"), "--cdi-spec-dir", str(node.cdi_dir),
        "--health-address", "off", "--health-interval", "0.2", *flags,
    ]  # fmt: skip
    if pod_uid:
        command += ["--pod-uid", pod_uid]
    with log.open("wb") as stream:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stream, env=env)


async def logged(log: Path, text: str, timeout: float) -> None:
    await until(lambda: text in log.read_text(), timeout=timeout, interval=0.05)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
async def test_the_standby_process_takes_over_when_the_publisher_is_stopped_or_killed(
    node: DraNode, api: ApiServerStandIn, processes: list[subprocess.Popen[bytes]], how: signal.Signals
) -> None:
    old_log, new_log = node.root / "old.log", node.root / "new.log"
    old = spawn_driver(node, "pod-old", old_log)
    processes.append(old)
    await node.wait_slice(unshared, timeout=30)
    new = spawn_driver(node, "pod-new", new_log, "--replicas", "2")
    processes.append(new)
    await logged(new_log, "ready in", timeout=30)
    await logged(new_log, "standby: another pod holds", timeout=1)
    before = slice_writes(api)
    async with SliceSampler(node) as sampler:
        await stays(lambda: slice_writes(api) == before, for_=2, message="a write while both pods ran")
        assert unshared(node.slice_devices())
        signalled = time.monotonic()
        old.send_signal(how)
        await node.wait_slice(shared, timeout=5)
        took = time.monotonic() - signalled
        at_rest = await settled(api)
        await stays(lambda: slice_writes(api) == at_rest, for_=1, message="a write at rest")
    assert await asyncio.to_thread(old.wait, 5) == (0 if how == signal.SIGTERM else -signal.SIGKILL)
    assert sampler.longest_gap == 0
    assert took < 3, f"the standby took {took:.1f}s to publish"
    await logged(new_log, "on standby: publishing the ResourceSlices", timeout=1)
    new.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(new.wait, 5) == 0
    assert "Traceback" not in old_log.read_text() + new_log.read_text()


# ------------------------------------------------------------------ sockets without POD_UID


async def test_without_pod_uid_the_driver_that_stops_leaves_the_others_sockets(node: DraNode) -> None:
    old = await node.start()
    await node.wait_slice(unshared)
    new = await node.start()  # the same socket names: the new pod takes them over
    assert (old.registrar_socket, old.endpoint) == (new.registrar_socket, new.endpoint)
    await node.stop(old)
    assert new.registrar_socket.is_socket() and new.endpoint.is_socket()
    kubelet = await node.kubelet(new)  # the kubelet still reaches the survivor through both names
    claim = node.claim("after", ["gpu-0"])
    assert (await kubelet.prepare([claim])).claims[claim[2]].error == ""
    await kubelet.close()
    await node.stop(new)
    assert not new.registrar_socket.exists() and not new.endpoint.exists()  # its own go with it
    assert [path.name for path in (node.root / "plugins" / DRIVER).glob("*.sock")] == []


async def test_a_socket_nothing_answers_is_removed_at_start_and_a_live_one_kept(node: DraNode) -> None:
    import socket

    live = await node.start(pod_uid="pod-live")
    dead = node.root / "plugins" / DRIVER / "dra-pod-dead.sock"
    with socket.socket(socket.AF_UNIX) as leftover:
        leftover.bind(str(dead))  # bound, never listening: what a pod that was killed leaves
    started = await node.start(pod_uid="pod-new")
    assert not dead.exists()
    assert live.endpoint.is_socket() and live.registrar_socket.is_socket() and started.endpoint.is_socket()


async def test_a_socket_path_too_long_to_connect_to_is_a_clear_error_at_start(node: DraNode) -> None:
    registrar_dir = node.root / ("r" * 80) / "plugins_registry"  # a kubelet root too long for any socket name
    registrar = registration_socket(registrar_dir, "pod-long")
    driver = DraDriver(
        node.options(pod_uid="pod-long", registrar_dir=registrar_dir), kube_settings=node.kube_settings()
    )
    try:
        with pytest.raises(StartupError) as raised:
            await driver.start()
    finally:
        await driver.shutdown()
    size = len(str(registrar).encode())
    assert str(raised.value) == (
        f"cannot serve the kubelet at {registrar}: the path has {size} bytes, and a unix socket's path is at most 107; "
        "the kubelet dials this path itself, so it must be shorter on the host too: a kubelet with a shorter root "
        "directory (--root-dir), named here by --kubelet-registrar-directory-path and --kubelet-plugins-directory-path "
        "(the chart's dra.kubeletRegistrarDirectoryPath and dra.kubeletPluginsDirectoryPath)"
    )
    assert not registrar_dir.exists()  # refused before anything was made


# ------------------------------------------------------------------ serialize.lock held by a wedged pod


def hold_lock(node: DraNode) -> int:
    """serialize.lock, held by this process as a wedged pod would hold it; the descriptor to close."""
    directory = node.root / "plugins" / DRIVER
    directory.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor


async def test_a_start_waiting_for_a_held_serialize_lock_says_so_and_stops_at_sigterm(
    node: DraNode, processes: list[subprocess.Popen[bytes]]
) -> None:
    descriptor = hold_lock(node)
    try:
        log = node.root / "driver.log"
        driver = spawn_driver(node, "pod-new", log)
        processes.append(driver)
        await logged(log, f"waiting for {node.root / 'plugins' / DRIVER / LOCK_FILE}, which another process holds", 30)
        assert not list((node.root / "plugins_registry").glob("*.sock"))  # not served before the claims are known
        signalled = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(driver.wait, 5) == 0
        assert time.monotonic() - signalled < 2
        assert "Traceback" not in log.read_text()
    finally:
        os.close(descriptor)


async def test_a_start_gives_up_on_a_held_serialize_lock_after_its_deadline_with_a_clear_error(
    node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    descriptor = hold_lock(node)
    letting_go = threading.Timer(5, os.close, (descriptor,))  # a start that blocks the loop would wait this long
    letting_go.start()
    driver = DraDriver(node.options(), kube_settings=node.kube_settings())
    driver.state.start_lock_timeout = 1.5
    started = time.monotonic()
    try:
        with pytest.raises(StartupError) as raised:
            await driver.start()
        assert time.monotonic() - started < 3
    finally:
        await driver.shutdown()
        letting_go.join()
    assert str(raised.value) == (
        f"cannot restore the prepared claims: {node.root / 'plugins' / DRIVER / LOCK_FILE} is held by another "
        "process for more than 1.5s "
        "(prepared claims): another pod of the driver on this node wedged?"
    )
    assert "waiting for" in caplog.text and "giving up after 1.5s" in caplog.text


async def test_a_prepare_waiting_for_a_held_serialize_lock_says_so_and_fails_at_its_deadline(
    node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    driver = await node.start()
    await node.wait_slice(unshared)
    driver.state.lock_timeout = 1.5
    kubelet = await node.kubelet(driver)
    claim = node.claim("waits", ["gpu-0"])
    descriptor = hold_lock(node)
    try:
        error = (await kubelet.prepare([claim])).claims[claim[2]].error
    finally:
        os.close(descriptor)
    assert f"{LOCK_FILE} is held by another process for more than 1.5s" in error
    assert f"waiting for {node.root / 'plugins' / DRIVER / LOCK_FILE}" in caplog.text
    assert (await kubelet.prepare([claim])).claims[claim[2]].error == ""  # let go: served again
    await kubelet.close()


# ------------------------------------------------------------------ claims across two pods with different config


async def test_a_share_the_old_pod_prepared_is_answered_and_unprepared_by_a_new_pod_that_shares_nothing(
    node: DraNode,
) -> None:
    old = await node.start(pod_uid="pod-old", config=Config(replicas=2))
    await node.wait_slice(shared)  # what the scheduler allocates from during the overlap
    new = await node.start(pod_uid="pod-new")  # the update takes the sharing away
    to_old, to_new = await node.kubelet(old), await node.kubelet(new)
    share = node.claim("share", ["board-0"], shares=1)
    before = (await to_old.prepare([share])).claims[share[2]]
    assert before.error == ""
    spec = (node.cdi_dir / cdi_spec_file(share[2])).read_text()
    assert (await to_new.prepare([share])).claims[share[2]] == before  # the kubelet's retry, from the checkpoint
    assert (node.cdi_dir / cdi_spec_file(share[2])).read_text() == spec  # as the old pod wrote it
    later = node.claim("later", ["board-0"], shares=1)  # allocated from the old pod's slices, prepared by the new one
    error = (await to_new.prepare([later])).claims[later[2]].error
    assert "claim default/later" in error and "allocated as a share, but it is not shared on this node now" in error
    assert (await to_new.unprepare([share])).claims[share[2]].error == ""
    assert not (node.cdi_dir / cdi_spec_file(share[2])).exists()
    whole = node.claim("whole", ["board-0"])
    assert (await to_old.prepare([whole])).claims[whole[2]].error == ""  # the old pod knows board-0 is free again
    for kubelet in (to_old, to_new):
        await kubelet.close()
