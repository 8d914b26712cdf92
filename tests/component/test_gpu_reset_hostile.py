"""The GPU reset against hostile peers: documents, deletions, stops, and ixsmi misbehaving."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
import tracemalloc
from pathlib import Path

import grpc
import pytest
from helpers.reset_support import (
    CHIP_A,
    CONFIG_MAP,
    EXPORTER,
    NAMESPACE,
    NODE,
    IxsmiBackend,
    Watched,
    devices_file,
    exporter,
    fake_ixsmi,
    handed_back,
    reset_document,
    start_resetting,
    start_with_api,
    write_document,
)
from helpers.support import RESOURCE, DaemonFactory, metric
from helpers.waits import stays, until

from ix_device_plugin.gpureset import sequence
from ix_device_plugin.gpureset.sequence import OUR_NAME, ResetInfo, ResetSettings
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.ixml import IxmlBackend
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.nodeagent import kit
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

WHERE = f"ConfigMap {NAMESPACE}/{CONFIG_MAP} key gpuReset"


async def refused(kubelet: KubeletStandIn, devices: list[str]) -> str:
    """Allocate devices, expecting a refusal; its message."""
    with pytest.raises(grpc.aio.AioRpcError) as refusal:
        await kubelet.allocate(RESOURCE, [devices])
    assert refusal.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return refusal.value.details() or ""


# ---- the document -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("occupy: " + "[" * 3000 + "]" * 3000, "nested more than 32 levels deep"),
        ("a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nnodename: *b\n", "anchors and aliases"),
    ],
    ids=["deeply-nested", "aliases"],
)
async def test_a_hostile_document_refuses_the_reset_naming_it_and_the_plugin_serves_on(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    short_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    text: str,
    problem: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="ix_device_plugin")
    write_document(apiserver, text)
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    await start_with_api(start_daemon, apiserver, short_dir, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    message = await refused(kubelet, [CHIP_A])
    assert WHERE in message and problem in message, message
    assert "cannot reach" not in message and "not reset" in message
    assert backend.resets == []
    logged = [r.getMessage() for r in caplog.records if WHERE in r.getMessage()]
    assert logged and all("cannot reach" not in line for line in logged), logged
    write_document(apiserver, ResetInfo(NODE, False, {}))  # fixed: the next Allocate resets
    await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert backend.resets == [(CHIP_A,)]
    stored = apiserver.get("configmaps", CONFIG_MAP, NAMESPACE)
    assert stored is not None and ResetInfo.parse(stored["data"]["gpuReset"], NODE).occupy[OUR_NAME] is True


# ---- ixsmi, another program ---------------------------------------------------------------------


def ixsmi_reset(tmp_path: Path, script: str, timeout: float = 5.0, abort: threading.Event | None = None) -> None:
    IxmlBackend(ixsmi_path=fake_ixsmi(tmp_path / "ixsmi", script)).reset([CHIP_A], timeout, abort)


def test_output_that_is_not_utf8_keeps_a_reset_good_and_a_failure_in_its_own_words(tmp_path: Path) -> None:
    ixsmi_reset(tmp_path, r"printf 'Reset \377\376 done\n'")  # no error: it exited 0
    with pytest.raises(BackendError) as failed:
        ixsmi_reset(tmp_path, r"printf 'GPU \377 is busy\n' >&2; exit 7")
    assert "exited with code 7: GPU \ufffd is busy" in str(failed.value)


def test_sixty_megabytes_of_output_are_not_kept(tmp_path: Path) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(BackendError) as failed:
            ixsmi_reset(tmp_path, "head -c 60000000 /dev/zero | tr '\\0' x; echo; echo 'the end'; exit 1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"{peak:,} bytes at the peak"
    message = str(failed.value)
    assert message.endswith("x the end") and len(message) < 700, message[-100:]


def test_an_overdue_ixsmi_is_killed_with_the_children_it_started(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"did not finish within 0.5s and was killed: started a child"):
        ixsmi_reset(tmp_path, f"sleep 30 & echo $! > {child}; echo started a child; sleep 30", timeout=0.5)
    assert time.monotonic() - started < 5  # a hang guard: the children held the output pipe open
    assert_gone(int(child.read_text()))


def test_children_left_behind_by_an_ixsmi_that_exited_are_ended(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    started = time.monotonic()
    ixsmi_reset(tmp_path, f"sleep 30 & echo $! > {child}; echo done")
    assert time.monotonic() - started < 5
    assert_gone(int(child.read_text()))


def test_a_stop_kills_a_running_ixsmi_at_once(tmp_path: Path) -> None:
    abort = threading.Event()
    threading.Timer(0.3, abort.set).start()
    started = time.monotonic()
    with pytest.raises(BackendError, match="was killed unfinished: the plugin is stopping"):
        ixsmi_reset(tmp_path, "sleep 30", timeout=60, abort=abort)
    assert time.monotonic() - started < 5


def assert_gone(pid: int) -> None:
    """The process no longer runs (a zombie not yet reaped by init counts as gone)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"process {pid} still runs")


# ---- the ConfigMap deleted ----------------------------------------------------------------------


async def test_the_config_map_deleted_during_the_handshake_calls_the_reset_off_and_is_written_back_whole(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: True}))  # ix-exporter holds the GPUs, and hangs
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    await start_with_api(start_daemon, apiserver, short_dir, backend, reset=ResetSettings(10.0, 5.0))
    await kubelet.wait_registered(RESOURCE, capacity=2)
    pending = asyncio.create_task(refused(kubelet, [CHIP_A]))
    await until(lambda: (info := reset_document(apiserver)) is not None and info.reset)
    apiserver.delete("configmaps", CONFIG_MAP, NAMESPACE)
    message = await pending
    assert f"ConfigMap {NAMESPACE}/{CONFIG_MAP} was deleted during the reset handshake" in message, message
    assert "ix-exporter (holding the GPUs when last read) cannot be asked to let go" in message
    assert "the GPUs were not reset" in message
    assert backend.resets == []
    assert reset_document(apiserver) == ResetInfo(NODE, False, {EXPORTER: True, OUR_NAME: True})


async def test_the_config_map_deleted_between_resets_refuses_the_next_one_and_keeps_the_others_entries(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: True}))
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    await start_with_api(start_daemon, apiserver, short_dir, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    await until(lambda: (info := reset_document(apiserver)) is not None and OUR_NAME in info.occupy)
    apiserver.delete("configmaps", CONFIG_MAP, NAMESPACE)
    message = await refused(kubelet, [CHIP_A])
    assert "was deleted during the reset handshake" in message and backend.resets == []
    assert reset_document(apiserver) == ResetInfo(NODE, False, {EXPORTER: True, OUR_NAME: True})
    other = asyncio.create_task(exporter(apiserver, [], lets_go=True))
    try:
        await kubelet.allocate(RESOURCE, [[CHIP_A]])  # with the ConfigMap back, the handshake is on again
    finally:
        other.cancel()
    assert backend.resets == [(CHIP_A,)]


# ---- a user that lets go and never comes back ---------------------------------------------------


async def lets_go_once(apiserver: ApiServerStandIn) -> None:
    """ix-exporter letting go at the first reset: true, and never writing again (it died)."""
    while (info := reset_document(apiserver)) is None or not info.reset:
        await asyncio.sleep(0.02)
    write_document(apiserver, ResetInfo(NODE, True, {**info.occupy, EXPORTER: False}))


async def test_a_user_that_never_comes_back_fails_that_allocate_and_is_not_waited_for_again(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: True}))
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    daemon = await start_with_api(start_daemon, apiserver, short_dir, backend, reset=ResetSettings(1.0, 5.0))
    await kubelet.wait_registered(RESOURCE, capacity=2)
    other = asyncio.create_task(lets_go_once(apiserver))
    message = await refused(kubelet, [CHIP_A])
    await other
    assert "the GPUs were reset, but ix-exporter let go of them for it and did not take them back within 1s" in message
    started = time.monotonic()
    await kubelet.allocate(RESOURCE, [[CHIP_A]])  # not waited for again
    assert time.monotonic() - started < 0.9, "the second reset waited for ix-exporter again"
    assert backend.resets == [(CHIP_A,), (CHIP_A,)]
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="ok") == 1
    seen: list[tuple[bool, dict[str, bool]]] = []
    back = asyncio.create_task(exporter(apiserver, seen, lets_go=True))  # it comes back: waited for again
    try:
        await until(lambda: (info := reset_document(apiserver)) is not None and info.occupy[EXPORTER])
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    finally:
        back.cancel()
    assert (True, {EXPORTER: False, OUR_NAME: False}) in seen
    assert reset_document(apiserver) == ResetInfo(NODE, False, {EXPORTER: True, OUR_NAME: True})


# ---- a stop during a reset ----------------------------------------------------------------------


async def reset_false_seen(apiserver: ApiServerStandIn, ended: Path) -> bool:
    """Once the document says reset: true and then false again: whether ixsmi had ended by then."""
    while (info := reset_document(apiserver)) is None or not info.reset:
        await asyncio.sleep(0.01)
    while (info := reset_document(apiserver)) is not None and info.reset:
        await asyncio.sleep(0.01)
    return ended.exists()


@pytest.mark.parametrize("takes", [0.5, 30.0], ids=["ends-in-time", "hangs"])
async def test_a_stop_during_a_reset_says_reset_false_only_once_ixsmi_is_over(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    short_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    takes: float,
) -> None:
    monkeypatch.setattr(sequence, "RESET_STOP_WAIT", 1.0)
    monkeypatch.setattr(kit, "RESET_STOP_WAIT", 1.0)
    started, ended = tmp_path / "started", tmp_path / "ended"
    ixsmi = fake_ixsmi(tmp_path / "ixsmi", f"echo $$ > {started}; sleep {takes}; touch {ended}")
    backend = IxsmiBackend(devices_file(tmp_path / "d.yaml"), ixsmi)
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: True}))
    other = asyncio.create_task(exporter(apiserver, [], lets_go=True))
    watcher = asyncio.create_task(reset_false_seen(apiserver, ended))
    try:
        daemon = await start_with_api(start_daemon, apiserver, short_dir, backend)
        await kubelet.wait_registered(RESOURCE, capacity=2)
        pending = asyncio.create_task(kubelet.allocate(RESOURCE, [[CHIP_A]]))
        await until(started.exists)
        stopping = time.monotonic()
        await daemon.shutdown()
        stopped_in = time.monotonic() - stopping
        with pytest.raises(grpc.aio.AioRpcError):
            await pending
        async with asyncio.timeout(5):
            ixsmi_was_over = await watcher
    finally:
        other.cancel()
        watcher.cancel()
    if takes < 1.0:
        assert ixsmi_was_over, "reset: false was said while ixsmi still ran"
    else:  # killed after the stop's wait: it never ended on its own, and no longer runs
        assert not ended.exists() and 0.8 < stopped_in < 6
        assert_gone(int(started.read_text()))
    assert handed_back(apiserver)


async def test_the_handshakes_background_task_runs_on_and_is_never_taken_for_down(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    short_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="ix_device_plugin")
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    daemon = await start_with_api(start_daemon, apiserver, short_dir, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    await until(lambda: (info := reset_document(apiserver)) is not None and OUR_NAME in info.occupy)
    await stays(
        lambda: daemon.service.down() == [] and daemon.live()[0],
        for_=0.8,
        message="past the supervisor's first restart delay",
    )
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# ---- telemetry, the plugin's other user of the GPU library --------------------------------------


async def test_telemetry_lets_go_of_the_library_and_pauses_while_ixsmi_runs(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, tmp_path: Path
) -> None:
    backend = Watched(devices_file(tmp_path / "d.yaml"), reset_seconds=0.5)
    await start_resetting(start_daemon, backend, telemetry_interval=0.05)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    await until(lambda: "sample" in backend.events)
    await kubelet.allocate(RESOURCE, [[CHIP_A]])
    await until(lambda: backend.events[-1] == "sample")  # passes again after the reset
    begins, ends = backend.events.index("reset begins"), backend.events.index("reset ends")
    assert backend.events[begins - 1] == "close", backend.events  # telemetry released the library first
    assert "sample" not in backend.events[begins:ends], "a telemetry pass ran during the reset"
