"""flags.reset_gpu: chips reset before Allocate answers, with Iluvatar's handshake on ix-gpu-reset-<node>."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import grpc
import pytest
from helpers.reset_support import (
    CHIP_A,
    CHIP_B,
    EXPORTER,
    NODE,
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

from ix_device_plugin.gpureset.sequence import OUR_NAME, GpuResetError, ResetInfo, ResetSettings
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.ixml import IxmlBackend
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

# ---- the document, as upstream reads and writes it -----------------------------------------


def test_the_document_round_trips_in_upstreams_format() -> None:
    upstream = "nodename: gpu-node-1\noccupy:\n  ix-device-plugin: true\n  ix-exporter: true\nreset: false\n"
    info = ResetInfo.parse(upstream, NODE)
    assert info == ResetInfo(NODE, False, {OUR_NAME: True, EXPORTER: True})
    assert info.text() == upstream
    resetting = info.ours(resetting=True)
    assert (resetting.reset, resetting.occupy) == (True, {OUR_NAME: False, EXPORTER: True})
    assert resetting.holding() == [EXPORTER] and resetting.away() == []
    assert ResetInfo.parse(None, NODE) == ResetInfo(NODE)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "is not a mapping"),
        ("occupy: {ix-exporter: maybe}", "occupy must map each IXML user to true or false"),
        ("nodename: [", "is not a reset document: "),
    ],
)
def test_a_broken_document_is_an_error_that_says_what(text: str, message: str) -> None:
    with pytest.raises(GpuResetError, match=message):
        ResetInfo.parse(text, NODE)


# ---- the backends ------------------------------------------------------------------------------


def test_the_simulated_backend_resets_fails_and_renames_as_its_file_says(tmp_path: Path) -> None:
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml", {"fail": [CHIP_B], "new_uuid": [CHIP_A]})))
    backend.reset([CHIP_A], 1.0)
    uuids = [chip.uuid for chip in backend.discover().chips()]
    assert uuids == [f"{CHIP_A}-reset1", CHIP_B]
    with pytest.raises(BackendError, match=f"{CHIP_B} did not reset"):
        backend.reset([CHIP_B], 1.0)
    assert backend.resets == [(CHIP_A,), (CHIP_B,)]


def test_the_ixml_backend_runs_ixsmi_with_the_uuids(tmp_path: Path) -> None:
    record = tmp_path / "args"
    ixsmi = fake_ixsmi(tmp_path / "ixsmi", f'echo "$@" > {record}; echo "Reset GPU done"')
    IxmlBackend(ixsmi_path=ixsmi).reset([CHIP_A, CHIP_B], 5.0)
    assert record.read_text().split() == ["-r", "-i", f"{CHIP_A},{CHIP_B}"]


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("echo 'GPU is busy' >&2; exit 3", "exited with code 3: GPU is busy"),
        ("sleep 5", "did not finish within 0.3s"),
    ],
)
def test_ixsmi_failures_are_reported_in_its_own_words(tmp_path: Path, script: str, message: str) -> None:
    ixsmi = fake_ixsmi(tmp_path / "ixsmi", script)
    with pytest.raises(BackendError, match=message):
        IxmlBackend(ixsmi_path=ixsmi).reset([CHIP_A], 0.3)


def test_a_missing_ixsmi_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="not found: install CoreX's ixsmi or set --ixsmi-path"):
        IxmlBackend(ixsmi_path=str(tmp_path / "nope")).reset([CHIP_A], 1.0)


# ---- the daemon, without API access -------------------------------------------------------------


async def test_allocate_resets_the_chips_first_and_counts_it(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin")
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    daemon = await start_resetting(start_daemon, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    response = await kubelet.allocate(RESOURCE, [[CHIP_B]])
    assert response.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_B
    assert backend.resets == [(CHIP_B,)]
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="ok") == 1
    assert metric(daemon, "ix_device_plugin_gpu_reset_duration_seconds_count") == 1
    [said] = [r.getMessage() for r in caplog.records if "other IXML users such as ix-exporter" in r.getMessage()]
    assert said.startswith("flags.reset_gpu resets GPUs without API access")
    assert any(f"GPU reset of {CHIP_B}: ok" in r.getMessage() for r in caplog.records)


async def test_a_bad_request_is_refused_without_a_reset(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, tmp_path: Path
) -> None:
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    await start_resetting(start_daemon, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [["GPU-unknown"]])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert backend.resets == []


async def test_a_failed_reset_refuses_allocate_and_the_next_one_works(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, tmp_path: Path
) -> None:
    path = devices_file(tmp_path / "d.yaml", {"fail": [CHIP_A]})
    backend = SimulatedBackend(str(path))
    daemon = await start_resetting(start_daemon, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"resetting {CHIP_A} failed" in (refused.value.details() or "")
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="failed") == 1
    devices_file(path)  # the chip resets fine again
    await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="ok") == 1


async def test_a_chip_that_comes_back_with_a_new_uuid_fails_allocate_and_is_advertised_anew(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, tmp_path: Path
) -> None:
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml", {"new_uuid": [CHIP_A]})))
    daemon = await start_resetting(start_daemon, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert "the kubelet retries" in (refused.value.details() or "")
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="uuid_changed") == 1
    await kubelet.wait_for(lambda: f"{CHIP_A}-reset1" in kubelet.resources[RESOURCE].devices)


async def test_no_reset_when_the_setting_is_off(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, tmp_path: Path
) -> None:
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    await start_daemon(backend_factory=lambda: backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert backend.resets == []


# ---- the handshake, against the stand-in API server ----------------------------------------------


async def test_the_plugin_says_it_holds_the_gpus_at_start_and_keeps_the_others_entries(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: True}))
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    await start_with_api(start_daemon, apiserver, short_dir, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    info = await until(
        lambda: (doc := reset_document(apiserver)) is not None and OUR_NAME in doc.occupy and doc,
        timeout=5,
        message="the reset document naming us",
    )
    assert info == ResetInfo(NODE, False, {EXPORTER: True, OUR_NAME: True})
    assert backend.resets == []


async def test_a_restart_whose_record_already_says_so_writes_nothing(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    """A restart, an upgrade or a config rollout finds reset: false and its own entry already there: the record is
    read, not written again (on a fleet, one write per node per rollout saved)."""
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: True, OUR_NAME: True}))
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    await start_with_api(start_daemon, apiserver, short_dir, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    record = "/configmaps/ix-gpu-reset-"
    await until(lambda: any(record in r.path and r.method == "GET" for r in apiserver.requests), timeout=5)
    await stays(
        lambda: [r.method for r in apiserver.requests if record in r.path] == ["GET"],
        for_=0.3,
        message="a write would follow its read at once",
    )
    assert reset_document(apiserver) == ResetInfo(NODE, False, {EXPORTER: True, OUR_NAME: True})


async def test_a_reset_with_no_one_else_holding_the_gpus_reads_the_record_only_before_each_write(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    """Seed 845231: every reset read the ConfigMap four times and wrote it twice; what a write left there (read just
    before it, no other write between) needs no read to know that no one holds the GPUs, or is away."""
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    await start_with_api(start_daemon, apiserver, short_dir, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    record = "/configmaps/ix-gpu-reset-"
    await until(lambda: reset_document(apiserver) is not None, timeout=5)
    before = len(apiserver.requests)
    await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert backend.resets == [(CHIP_A,)]
    calls = [r.method for r in apiserver.requests[before:] if record in r.path]
    assert calls == ["GET", "PUT", "GET", "PUT"]
    assert reset_document(apiserver) == ResetInfo(NODE, False, {OUR_NAME: True})


async def test_the_exporter_lets_go_during_the_reset_and_takes_the_gpus_back(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: True}))
    seen: list[tuple[bool, dict[str, bool]]] = []
    other = asyncio.create_task(exporter(apiserver, seen, lets_go=True))
    try:
        backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
        await start_with_api(start_daemon, apiserver, short_dir, backend)
        await kubelet.wait_registered(RESOURCE, capacity=2)
        await kubelet.allocate(RESOURCE, [[CHIP_A, CHIP_B]])
        assert backend.resets == [(CHIP_A, CHIP_B)]
        await asyncio.sleep(0.2)
    finally:
        other.cancel()
    assert (True, {EXPORTER: False, OUR_NAME: False}) in seen, "everyone let go before the reset"
    assert reset_document(apiserver) == ResetInfo(NODE, False, {EXPORTER: True, OUR_NAME: True})


async def test_an_exporter_that_does_not_let_go_is_named_and_reset_true_is_not_left_behind(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: True}))
    other = asyncio.create_task(exporter(apiserver, [], lets_go=False))
    try:
        backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
        daemon = await start_with_api(start_daemon, apiserver, short_dir, backend, reset=ResetSettings(0.5, 5.0))
        await kubelet.wait_registered(RESOURCE, capacity=2)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet.allocate(RESOURCE, [[CHIP_A]])
    finally:
        other.cancel()
    assert "ix-exporter did not let go of the GPUs within 0.5s" in (refused.value.details() or "")
    assert backend.resets == []
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="refused") == 1
    assert handed_back(apiserver)


async def test_a_stop_in_the_middle_of_a_reset_leaves_reset_false(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: True}))
    other = asyncio.create_task(exporter(apiserver, [], lets_go=False))
    try:
        backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
        daemon = await start_with_api(start_daemon, apiserver, short_dir, backend, reset=ResetSettings(60.0, 5.0))
        await kubelet.wait_registered(RESOURCE, capacity=2)
        pending = asyncio.create_task(kubelet.allocate(RESOURCE, [[CHIP_A]]))
        await until(lambda: (doc := reset_document(apiserver)) is not None and doc.reset, timeout=5)
        await daemon.shutdown()
        with pytest.raises(grpc.aio.AioRpcError):
            await pending
    finally:
        other.cancel()
    assert handed_back(apiserver)
    assert backend.resets == []


async def test_an_unreachable_api_server_refuses_the_reset_and_allocate_says_why(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path, tmp_path: Path
) -> None:
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    daemon = await start_with_api(start_daemon, apiserver, short_dir, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    await apiserver.refuse()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    details = refused.value.details() or ""
    assert "the reset handshake failed: " in details and f"cannot reach the API server at {apiserver.url}" in details
    assert backend.resets == []
    await apiserver.accept()
    await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert backend.resets == [(CHIP_A,)]
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="ok") == 1


def test_reset_gpu_with_replicas_is_a_config_error_naming_both_keys(tmp_path: Path) -> None:
    config = tmp_path / "ix-config"
    config.write_text("flags:\n  reset_gpu: true\nsharing:\n  timeSlicing:\n    replicas: 2\n")
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("IX_")}
    result = subprocess.run(
        [sys.executable, "-m", "ix_device_plugin", "check-config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert "flags.reset_gpu" in result.stderr and "sharing.timeSlicing.replicas" in result.stderr


async def test_an_unexpected_failure_before_allocate_is_an_internal_error_not_a_dead_server(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    daemon = await start_resetting(start_daemon, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)

    async def broken(uuids: object) -> None:
        raise RuntimeError("a defect")

    daemon.node.gpu_reset.reset = broken  # type: ignore[method-assign]
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert failed.value.details() == "Allocate failed: a defect"
    assert metric(daemon, "ix_device_plugin_call_errors_total", method="Allocate", code="INTERNAL") == 1
    assert not any(record.exc_info for record in caplog.records if record.levelno >= logging.ERROR)
    await kubelet.preferred(RESOURCE, [CHIP_A, CHIP_B], [], 1)  # still serving
