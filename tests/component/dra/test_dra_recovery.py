"""The DRA driver restarted in the middle of an operation, and what another writer put on disk or in the API.

Real driver processes (killed with SIGKILL or stopped with SIGTERM), real gRPC over unix sockets, the kubelet and
API server stand-ins, real files; the GPUs are the simulated backend's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from helpers.dra_support import DraNode, answer, gpu_config
from helpers.host_tools import tmpfs
from helpers.waits import stays, until

from ix_device_plugin.dra.checkpoint import CHECKPOINT_FILE
from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.dra.registration import registration_socket
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.gpureset.document import DATA_KEY, ResetInfo
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.files import read_boot_id
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.dra_kubelet import DraKubeletStandIn

EXPORTER = "ix-exporter"


def checkpoint(node: DraNode) -> dict[str, Any]:
    return json.loads(node.checkpoint_file.read_text())


# ---- a driver in a process of its own ----------------------------------------------------------------------


def driver_process(node: DraNode, *flags: str) -> subprocess.Popen[bytes]:
    """`ix-device-plugin dra` on node's simulated chips and directories, as DraNode.start runs it in-process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IX_") and k != "POD_NAMESPACE"}
    command = [
        sys.executable, "-m", "ix_device_plugin", "dra",
        "--backend", "simulated", "--simulated-devices", str(node.devices_file),
        "--dev-root", str(node.root), "--sysfs-root", str(node.root / "sys"),
        "--node-name", node.node, "--kubeconfig", str(node.kubeconfig),
        "--kubelet-registrar-directory-path", str(node.root / "plugins_registry"),
        "--kubelet-plugins-directory-path", str(node.root / "plugins"),
        "--cdi-spec-dir", str(node.cdi_dir), "--health-interval", "0.2", *flags,
    ]  # fmt: skip
    return subprocess.Popen(command, stderr=subprocess.PIPE, env=env)


def list_dra(node: DraNode) -> subprocess.CompletedProcess[str]:
    """`ix-device-plugin list --dra` on node, in a process of its own."""
    argv = ["list", "--dra", "--backend", "simulated", "--simulated-devices", str(node.devices_file)]
    argv += ["--node-name", node.node, "--kubelet-plugins-directory-path", str(node.root / "plugins")]
    return subprocess.run([sys.executable, "-m", "ix_device_plugin", *argv], capture_output=True, text=True)


async def registered(node: DraNode) -> DraKubeletStandIn:
    """A kubelet stand-in registered with the driver process on node (fixed socket names: no POD_UID)."""
    kubelet = DraKubeletStandIn(DRIVER)
    socket = registration_socket(node.root / "plugins_registry")
    await kubelet.wait_for_socket(socket, timeout=20)
    async with asyncio.timeout(10):
        while True:  # as the kubelet's plugin watcher does: the socket may be there a moment before it is served
            try:
                await kubelet.register(socket)
                return kubelet
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)


# ---- ix-exporter's side of the reset handshake ----------------------------------------------------------------


class Handshake:
    """The node's ix-gpu-reset ConfigMap in the API server stand-in, and ix-exporter's side of it."""

    def __init__(self, api: ApiServerStandIn, node: DraNode) -> None:
        self.api = api
        self.node = node.node
        self.namespace = node.kube_settings().namespace
        self.name = f"ix-gpu-reset-{node.node}"

    def document(self) -> ResetInfo | None:
        found = self.api.get("configmaps", self.name, self.namespace)
        return None if found is None else ResetInfo.parse(found["data"][DATA_KEY], self.node)

    def write(self, info: ResetInfo) -> None:
        metadata = {"name": self.name, "namespace": self.namespace}
        self.api.put("configmaps", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                                    "data": {DATA_KEY: info.text()}})  # fmt: skip

    async def exporter(self) -> None:
        """ix-exporter: lets go of the GPUs while reset is true, takes them back when it is false."""
        while True:
            info = self.document()
            if info is not None and info.occupy.get(EXPORTER) != (not info.reset):
                self.write(ResetInfo(info.nodename, info.reset, {**info.occupy, EXPORTER: not info.reset}))
            await asyncio.sleep(0.05)


# ---- item: a reset cut short ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM])
async def test_a_reset_cut_short_by_a_kill_or_a_stop_runs_at_the_retry_and_the_handshake_is_repaired_at_start(
    node: DraNode, api: ApiServerStandIn, processes: list[subprocess.Popen[bytes]], stop: signal.Signals
) -> None:
    node.boot_id_file.write_text(read_boot_id() + "\n")  # the process reads this boot's ID
    handshake = Handshake(api, node)
    handshake.write(ResetInfo(node.node, False, {EXPORTER: True}))  # ix-exporter holds the GPUs, and hangs
    process = driver_process(node, "--reset-wait-timeout", "30", "--health-address", "off")
    processes.append(process)
    kubelet = await registered(node)
    claim = node.claim("fresh", ["gpu-0"], config=[gpu_config(reset=True)])
    call = asyncio.create_task(kubelet.prepare([claim]))
    await until(lambda: (info := handshake.document()) is not None and info.reset, timeout=20)  # waits for exporter
    process.send_signal(stop)
    assert await asyncio.to_thread(process.wait, 10) in (-signal.SIGKILL, 0)
    with pytest.raises(grpc.aio.AioRpcError):
        await call
    await kubelet.close()
    assert checkpoint(node)["claims"][claim[2]]["resetPending"] is True  # recorded on disk before the reset
    assert "default/fresh" in (listed := list_dra(node)).stdout and "(GPU reset pending)" in listed.stdout
    backend = SimulatedBackend(str(node.devices_file))
    exporter = asyncio.create_task(handshake.exporter())  # ix-exporter answers from now on
    try:
        driver = await node.start(backend_factory=lambda: backend, reset_wait_timeout=5.0, reset_timeout=5.0)
        # before any prepare: reset: false again, and ix-exporter has the GPUs back
        repaired = ResetInfo(node.node, False, {EXPORTER: True, "ix-device-plugin": True})
        await until(lambda: handshake.document() == repaired, timeout=10)
        assert backend.resets == []
        kubelet = await node.kubelet(driver)
        assert answer(await kubelet.prepare([claim]), claim[2]).error == ""  # the kubelet's retry
        assert backend.resets == [(driver.content.by_name()["gpu-0"].chip.uuid,)]  # run, not skipped
        assert "resetPending" not in checkpoint(node)["claims"][claim[2]]
        assert answer(await kubelet.prepare([claim]), claim[2]).error == ""  # answered again, not reset again
        assert len(backend.resets) == 1
        await kubelet.close()
    finally:
        exporter.cancel()


async def test_the_unprepare_of_a_claim_whose_reset_was_cut_short_forgets_it_without_a_reset(
    node: DraNode, api: ApiServerStandIn, processes: list[subprocess.Popen[bytes]]
) -> None:
    node.boot_id_file.write_text(read_boot_id() + "\n")
    handshake = Handshake(api, node)
    handshake.write(ResetInfo(node.node, False, {EXPORTER: True}))
    process = driver_process(node, "--reset-wait-timeout", "30", "--health-address", "off")
    processes.append(process)
    kubelet = await registered(node)
    claim = node.claim("gone", ["gpu-1"], config=[gpu_config(reset=True)])
    call = asyncio.create_task(kubelet.prepare([claim]))
    await until(lambda: (info := handshake.document()) is not None and info.reset, timeout=20)
    process.kill()
    await asyncio.to_thread(process.wait, 10)
    with pytest.raises(grpc.aio.AioRpcError):
        await call
    await kubelet.close()
    backend = SimulatedBackend(str(node.devices_file))
    driver = await node.start(backend_factory=lambda: backend, reset_wait_timeout=5.0, reset_timeout=5.0)
    kubelet = await node.kubelet(driver)
    assert answer(await kubelet.unprepare([claim]), claim[2]).error == ""  # the pod was deleted meanwhile
    assert backend.resets == [] and claim[2] not in checkpoint(node)["claims"]
    other = node.claim("next", ["gpu-1"])
    assert answer(await kubelet.prepare([other]), other[2]).error == ""
    await kubelet.close()


async def test_a_reboot_while_a_claims_reset_is_pending_writes_its_spec_again_and_the_retry_resets(
    node: DraNode, api: ApiServerStandIn
) -> None:
    handshake = Handshake(api, node)
    handshake.write(ResetInfo(node.node, False, {EXPORTER: True}))  # ix-exporter holds the GPUs, and hangs
    backend = SimulatedBackend(str(node.devices_file))
    driver = await node.start(backend_factory=lambda: backend, reset_wait_timeout=30.0, reset_timeout=5.0)
    kubelet = await node.kubelet(driver)
    claim = node.claim("fresh", ["gpu-2"], config=[gpu_config(reset=True)])
    call = asyncio.create_task(kubelet.prepare([claim]))
    await until(lambda: (info := handshake.document()) is not None and info.reset)
    await node.stop(driver)  # the node goes down with the reset waiting
    call.cancel()  # the call's connection would go with the node
    assert isinstance((await asyncio.gather(call, return_exceptions=True))[0], BaseException)  # never answered
    await kubelet.close()
    spec = node.cdi_dir / cdi_spec_file(claim[2])
    node.reboot()
    assert not spec.exists() and checkpoint(node)["claims"][claim[2]]["resetPending"] is True
    exporter = asyncio.create_task(handshake.exporter())
    try:
        restarted = await node.start(backend_factory=lambda: backend, reset_wait_timeout=5.0, reset_timeout=5.0)
        assert spec.exists()  # written again before the kubelet is served: its CDI ID resolves
        assert checkpoint(node)["bootID"] == node.boot_id_file.read_text().strip()
        assert checkpoint(node)["claims"][claim[2]]["resetPending"] is True  # still owed
        assert backend.resets == []
        kubelet = await node.kubelet(restarted)
        assert answer(await kubelet.prepare([claim]), claim[2]).error == ""  # the kubelet's retry after the reboot
        assert backend.resets == [(restarted.content.by_name()["gpu-2"].chip.uuid,)]
        assert "resetPending" not in checkpoint(node)["claims"][claim[2]]
        await kubelet.close()
    finally:
        exporter.cancel()


# ---- item: a double fault on disk ---------------------------------------------------------------------------


async def test_a_corrupt_checkpoint_and_a_malformed_claim_spec_forget_nothing_over_two_starts(
    node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin.dra")
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    held, broken = node.claim("held", ["gpu-2"]), node.claim("broken", ["gpu-3"])
    for claim in (held, broken):
        assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await kubelet.close()
    await node.stop(driver)
    node.checkpoint_file.write_text("{not json")
    bad_spec = node.cdi_dir / cdi_spec_file(broken[2])
    document = yaml.safe_load(bad_spec.read_text())
    document["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] = "/dev/iluvatar" + "9" * 5000
    bad_spec.write_text(yaml.safe_dump(document))
    good_spec = (node.cdi_dir / cdi_spec_file(held[2])).read_text()
    first = await node.start()  # the first start
    assert f"{bad_spec}: skipped, not a claim spec this driver can read" in caplog.text
    assert "1 claims rebuilt from their CDI specs" in caplog.text
    assert list(node.checkpoint_file.parent.glob(f"{CHECKPOINT_FILE}.corrupt-*"))  # kept for the operator
    assert set(checkpoint(node)["claims"]) == {held[2]}  # the rebuilt one, written
    await node.stop(first)
    second = await node.start()  # the next start: nothing more is lost
    assert set(second.state.claims) == {held[2]}
    assert (node.cdi_dir / cdi_spec_file(held[2])).read_text() == good_spec
    assert bad_spec.exists()  # never removed as an orphan: it cannot be read, the operator decides
    kubelet = await node.kubelet(second)
    rival = node.claim("rival", ["gpu-2"])
    assert "is prepared for claim unnamed (uid " in answer(await kubelet.prepare([rival]), rival[2]).error
    assert answer(await kubelet.prepare([held]), held[2]).error == ""
    await kubelet.close()


@pytest.mark.parametrize("entry", [None, "gpu-0", 7])
async def test_a_checkpoint_device_entry_of_the_wrong_type_is_set_aside_and_list_dra_says_why(
    node: DraNode, entry: Any, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("held", ["gpu-1"])
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await kubelet.close()
    await node.stop(driver)
    document = checkpoint(node)
    document["claims"][claim[2]]["devices"][0] = entry
    node.checkpoint_file.write_text(json.dumps(document))
    listed = list_dra(node)
    assert listed.returncode == 1 and "Traceback" not in listed.stderr
    assert f"claims.{claim[2]}.devices[0]: expected an object, got " in listed.stderr
    restarted = await node.start()
    assert f"claims.{claim[2]}.devices[0]: expected an object" in caplog.text and "kept as" in caplog.text
    assert set(restarted.state.claims) == {claim[2]}  # rebuilt from its spec: its chip stays held
    kubelet = await node.kubelet(restarted)
    rival = node.claim("rival", ["gpu-1"])
    assert "is prepared for claim" in answer(await kubelet.prepare([rival]), rival[2]).error
    await kubelet.close()


async def test_a_hand_edited_checkpoint_uid_that_climbs_out_writes_no_file_outside(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("held", ["gpu-1"])
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await kubelet.close()
    await node.stop(driver)
    document = checkpoint(node)
    document["claims"]["../../escaped"] = document["claims"].pop(claim[2])
    node.checkpoint_file.write_text(json.dumps(document))
    node.reboot()  # the specs are written again at start: from the checkpoint's UIDs, were they trusted
    await node.start()
    assert not list(node.root.rglob("*escaped*")) and not list(node.root.parent.glob("*escaped*"))


async def test_a_checkpoint_corrupted_while_the_driver_runs_is_rebuilt_at_the_next_call(
    node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    held = node.claim("held", ["gpu-0"])
    assert answer(await kubelet.prepare([held]), held[2]).error == ""
    node.checkpoint_file.write_text('{"version": 1, "claims": {"x": null}}')
    fresh = node.claim("fresh", ["gpu-1"])
    assert answer(await kubelet.prepare([fresh]), fresh[2]).error == ""  # not failed until a restart
    assert "claims.x: expected an object, got null" in caplog.text
    assert set(checkpoint(node)["claims"]) == {held[2], fresh[2]}
    assert checkpoint(node)["claims"][held[2]]["name"] == "held"  # what memory knew of it, not only its spec
    rival = node.claim("rival", ["gpu-0"])
    assert "is prepared for claim default/held" in answer(await kubelet.prepare([rival]), rival[2]).error
    await kubelet.close()


# ---- item: a quantity that would freeze the driver ---------------------------------------------------------


async def test_a_huge_consumed_capacity_fails_its_claim_fast_and_freezes_nothing(
    node: DraNode, api: ApiServerStandIn, processes: list[subprocess.Popen[bytes]]
) -> None:
    port = _free_port()
    process = driver_process(node, "--splitboard", "true", "--replicas", "4", "--health-address", f"127.0.0.1:{port}")
    processes.append(process)
    kubelet = await registered(node)
    await node.wait_slice(lambda devices: "gpu-0" in devices, timeout=20)
    huge = node.claim("huge", ["gpu-0"], shares=1)
    stored = api.get("resourceclaims", "huge", "default")
    assert stored is not None
    stored["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {"shares": "1e10000000"}
    api.put("resourceclaims", stored)
    good = node.claim("good", ["gpu-1"], shares=2)
    started = time.monotonic()
    calls = [kubelet.prepare([huge]), kubelet.prepare([good]), asyncio.to_thread(_get, port, "/healthz")]
    hostile, fine, probe = await asyncio.gather(*calls)
    assert time.monotonic() - started < 3
    assert "claim default/huge" in answer(hostile, huge[2]).error
    assert "consumedCapacity shares '1e10000000'" in answer(hostile, huge[2]).error
    assert answer(fine, good[2]).error == ""
    assert probe == 200
    over = node.claim("over", ["gpu-2"], shares=5)  # more than the device's 4 shares: that claim's error
    error = answer(await kubelet.prepare([over]), over[2]).error
    assert "claim default/over" in error and "consumedCapacity shares 5 is more than the 4 shares" in error
    await kubelet.close()
    stopping = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 10) == 0
    assert time.monotonic() - stopping < 2.5
    assert b"Traceback" not in process.communicate(timeout=10)[1]


def _get(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
        return int(response.status)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ---- item: weak spots -------------------------------------------------------------------------------------


async def test_a_prepare_and_an_unprepare_racing_on_one_claim_end_as_the_last_one_asked(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    claim = node.claim("racing", ["gpu-0"])
    reading, release = asyncio.Event(), asyncio.Event()
    assert driver.api_side is not None
    reads = driver.api_side.reads
    read_claim = reads.claim

    async def slow_read(ref: Any) -> Any:  # the API server answers the prepare's read late
        reading.set()
        await release.wait()
        return await read_claim(ref)

    unprepare_asked, state_unprepare = asyncio.Event(), driver.state.unprepare

    async def noted_unprepare(ref: Any) -> Any:
        unprepare_asked.set()
        return await state_unprepare(ref)

    reads.claim = slow_read  # type: ignore[method-assign]
    driver.state.unprepare = noted_unprepare  # type: ignore[method-assign]
    kubelet = await node.kubelet(driver)
    prepare = asyncio.create_task(kubelet.prepare([claim]))
    await reading.wait()
    unprepare = asyncio.create_task(kubelet.unprepare([claim]))  # the kubelet's last word on the claim
    await unprepare_asked.wait()  # it waits behind the prepare for the claim's turn
    release.set()
    assert answer(await prepare, claim[2]).error == "" and answer(await unprepare, claim[2]).error == ""
    assert claim[2] not in driver.state.claims and claim[2] not in checkpoint(node)["claims"]
    assert not (node.cdi_dir / cdi_spec_file(claim[2])).exists()
    await kubelet.close()


async def test_a_lock_file_that_is_a_directory_or_a_symlink_is_a_clear_error(node: DraNode, short_dir: Path) -> None:
    directory = node.root / "plugins" / DRIVER
    directory.mkdir(parents=True)
    (directory / "serialize.lock").mkdir()
    with pytest.raises(StartupError, match=r"(?i)serialize\.lock.*is a directory"):
        await node.start()
    (directory / "serialize.lock").rmdir()
    victim = short_dir / "victim"
    (directory / "serialize.lock").symlink_to(victim)
    with pytest.raises(StartupError, match=r"serialize\.lock.*symbolic link"):
        await node.start()
    assert not victim.exists()


@pytest.fixture
def read_only_plugins(short_dir: Path) -> Iterator[Path]:
    """The kubelet's plugins directory, mounted read-only (root only), unmounted afterwards."""
    mount = short_dir / "plugins"
    mount.mkdir()
    with tmpfs(mount, "ro,size=64k"):
        yield mount


async def test_a_read_only_plugins_directory_is_a_clear_error(read_only_plugins: Path, node: DraNode) -> None:
    with pytest.raises(StartupError, match=r"cannot create the driver's directory .*: Read-only file system"):
        await node.start()


async def test_write_failures_and_rebuilt_claims_are_named_in_the_prepare_answer(
    node: DraNode, short_dir: Path
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    node.cdi_dir.mkdir(exist_ok=True)
    blocked = node.claim("blocked", ["gpu-0"])
    (node.cdi_dir / cdi_spec_file(blocked[2])).mkdir()  # where its spec goes, something no write replaces
    error = answer(await kubelet.prepare([blocked]), blocked[2]).error
    assert error.startswith(f"claim default/blocked (uid {blocked[2]}): cannot write ")
    await kubelet.close()


async def test_a_retry_on_the_new_pod_during_the_old_pods_reset_waits_for_it_and_never_ends_it(
    node: DraNode, api: ApiServerStandIn
) -> None:
    handshake = Handshake(api, node)
    backend = SimulatedBackend(str(node.devices_file))  # one node: both pods reset the same chips
    old = await node.start(backend_factory=lambda: backend, pod_uid="pod-old", reset_wait_timeout=10.0)
    await node.wait_slice(lambda devices: len(devices) == 6)
    handshake.write(ResetInfo(node.node, False, {EXPORTER: True, "ix-device-plugin": True}))  # holds, hangs
    to_old = await node.kubelet(old)
    claim = node.claim("fresh", ["gpu-0"], config=[gpu_config(reset=True)])
    first = asyncio.create_task(to_old.prepare([claim]))
    await until(lambda: (info := handshake.document()) is not None and info.reset, timeout=10)
    new = await node.start(backend_factory=lambda: backend, pod_uid="pod-new", reset_wait_timeout=10.0)
    to_new = await node.kubelet(new)
    retry = asyncio.create_task(to_new.prepare([claim]))  # the kubelet gave up on the old pod's answer
    await stays(
        lambda: (info := handshake.document()) is not None and info.reset,
        for_=1.0,
        message="the new pod's start did not end the reset",
    )
    assert not retry.done() and backend.resets == []  # no answer before the chips are reset
    exporter = asyncio.create_task(handshake.exporter())  # ix-exporter lets go at last
    try:
        assert answer(await first, claim[2]).error == ""
        assert answer(await retry, claim[2]).error == ""
        assert len(backend.resets) == 1  # once, by the old pod: the new one read the claim again in its turn
    finally:
        exporter.cancel()
    await to_old.close()
    await to_new.close()


async def test_a_reset_whose_exporter_never_comes_back_fails_the_prepare_in_the_words_of_dra(
    node: DraNode, api: ApiServerStandIn
) -> None:
    handshake = Handshake(api, node)
    handshake.write(ResetInfo(node.node, False, {EXPORTER: True}))
    backend = SimulatedBackend(str(node.devices_file))
    driver = await node.start(backend_factory=lambda: backend, reset_wait_timeout=1.0, reset_timeout=5.0)
    kubelet = await node.kubelet(driver)
    claim = node.claim("late", ["gpu-1"], config=[gpu_config(reset=True)])

    async def lets_go_once() -> None:  # ix-exporter lets go at the first reset: true, and dies
        while (info := handshake.document()) is None or not info.reset:
            await asyncio.sleep(0.02)
        handshake.write(ResetInfo(node.node, True, {**info.occupy, EXPORTER: False}))

    exporter = asyncio.create_task(lets_go_once())
    error = answer(await kubelet.prepare([claim]), claim[2]).error
    await exporter
    assert error.startswith(f"claim default/late (uid {claim[2]}): GPU reset before the container starts: ")
    assert "did not take them back" in error and "Allocate" not in error
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""  # the retry: not waited for again
    assert len(backend.resets) == 2
    await kubelet.close()
