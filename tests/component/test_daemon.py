"""The reconcile loop: every trigger reaches the one owner of state, Allocate answers from the current plan,
stopping is bounded whatever a task or the GPU library does."""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from pathlib import Path

import grpc
import pytest
from helpers.support import RESOURCE, DaemonFactory, metric
from helpers.waits import stays, until

from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.deviceplugin.registrar import Registrar
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.runtime.filewatch import Watcher
from ix_device_plugin.settings.options import Options
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.tools.demo import ConfigMapDir

SHARED = "sharing:\n  timeSlicing:\n    replicas: 2\n"
SHARED_STRICT = SHARED + "    failRequestsGreaterThanOne: true\n"


# ---- 1. a cancellation racing a wake-up is never lost ---------------------------------------


async def test_watcher_wait_is_cancelled_even_when_woken_in_the_same_iteration() -> None:
    watcher = Watcher()
    waiting = asyncio.create_task(watcher.wait(30))
    await asyncio.sleep(0)  # now blocked on the event
    watcher._event.set()  # what a file event does...
    waiting.cancel()  # ...in the same loop iteration as shutdown's cancel
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(2):
            await waiting


async def test_registrar_backoff_is_cancelled_even_when_kicked_in_the_same_iteration(short_dir: Path) -> None:
    from ix_device_plugin.deviceplugin.metrics import Metrics

    registrar = Registrar(short_dir, "x.sock", lambda: RESOURCE, Metrics(), poll_interval=30)
    running = asyncio.create_task(registrar.run())
    await asyncio.sleep(0.05)  # idle: nothing requested
    registrar.request()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(2):
            await running


class RefusingKubelet(KubeletStandIn):
    """The kubelet stand-in, refusing the first `refusals` registrations and noting when each came."""

    def __init__(self, plugin_dir: Path, refusals: int) -> None:
        super().__init__(plugin_dir)
        self.refusals = refusals
        self.attempts: list[float] = []

    async def Register(self, request, context):  # type: ignore[no-untyped-def]
        self.attempts.append(time.monotonic())
        if len(self.attempts) <= self.refusals:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        return await super().Register(request, context)


async def test_a_refused_registration_is_retried_with_the_one_backoff_policy(
    plugin_dir: Path, start_daemon: DaemonFactory
) -> None:
    kubelet = RefusingKubelet(plugin_dir, refusals=4)
    await kubelet.start()
    try:
        daemon = await start_daemon("BI-V150:1")
        await kubelet.wait_registered(RESOURCE, capacity=1)
    finally:
        await kubelet.stop()
    gaps = [later - earlier for earlier, later in zip(kubelet.attempts, kubelet.attempts[1:], strict=False)]
    assert len(gaps) == 4
    for attempt, gap in enumerate(gaps):  # 0.05 s doubled each time, +-20 % jitter
        assert gap >= 0.05 * 2**attempt * 0.8, gaps
    assert metric(daemon, "ix_device_plugin_registration_failures_total") == 4


# ---- 2. Allocate always answers from the current plan ---------------------------------------


async def test_a_reload_that_changes_only_allocate_reaches_allocate(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    configmap = ConfigMapDir(short_dir / "ixconfig")
    configmap.write(SHARED)
    daemon = await start_daemon("BI-V150:2", config_path=configmap.path, config_required=True)
    view = await kubelet.wait_registered(RESOURCE, capacity=4)
    two = sorted(view.devices)[:2]
    await kubelet.allocate(RESOURCE, [two])  # allowed while failRequestsGreaterThanOne is off
    updates = view.updates
    configmap.write(SHARED_STRICT)
    await until(lambda: daemon.config.fail_requests_greater_than_one, timeout=3)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [two])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failRequestsGreaterThanOne" in (refused.value.details() or "")
    assert view.updates == updates  # the device view did not change: no ListAndWatch message


async def test_a_control_node_appearing_after_start_reaches_allocate(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    (short_dir / "dev").mkdir()
    await start_daemon("BI-V100:1", rediscover_interval=3600)
    view = await kubelet.wait_registered(RESOURCE, capacity=1)
    device = next(iter(view.devices))
    first = await kubelet.allocate(RESOURCE, [[device]])
    assert [spec.host_path for spec in first.container_responses[0].devices] == ["/dev/iluvatar0"]
    (short_dir / "dev" / "itrctl").touch()  # the driver's control node shows up late

    async def nodes() -> list[str]:
        response = await kubelet.allocate(RESOURCE, [[device]])
        return [spec.host_path for spec in response.container_responses[0].devices]

    async def both() -> bool:
        return await nodes() == ["/dev/iluvatar0", "/dev/itrctl"]

    await until(both, timeout=5, interval=0.05, message="Allocate answering the chip and its control node")


async def test_a_new_minor_under_the_same_uuid_reaches_allocate(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    devices = short_dir / "devices.yaml"
    devices.write_text("boards:\n  - product: BI-V100\n    chips:\n      - minor: 0\n")
    await start_daemon(str(devices), rediscover_interval=0.3)
    view = await kubelet.wait_registered(RESOURCE, capacity=1)
    device = next(iter(view.devices))
    devices.write_text("boards:\n  - product: BI-V100\n    chips:\n      - minor: 5\n")

    async def nodes() -> list[str]:
        response = await kubelet.allocate(RESOURCE, [[device]])
        return [spec.host_path for spec in response.container_responses[0].devices]

    async def the_new_minor() -> bool:
        return await nodes() == ["/dev/iluvatar5"]

    await until(the_new_minor, timeout=5, interval=0.05, message="Allocate answering the new minor")


# ---- 3. a failed apply keeps running and is retried -----------------------------------------


async def test_a_resource_name_change_while_the_plugin_directory_is_missing_is_retried(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path, plugin_dir: Path, caplog
) -> None:
    configmap = ConfigMapDir(short_dir / "ixconfig")
    configmap.write("flags:\n  splitboard: false\n")
    daemon = await start_daemon("BI-V100:2", config_path=configmap.path, config_required=True)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    await kubelet.stop()
    shutil.rmtree(plugin_dir)  # sockets, and the directory of the health story
    caplog.set_level(logging.ERROR, logger="ix_device_plugin.deviceplugin.daemon")
    configmap.write("resourceName: iluvatar.com/vgpu\n")
    await until(lambda: daemon.plan.resource_name == "iluvatar.com/vgpu", timeout=3)

    def not_there() -> int:
        return len([r for r in caplog.records if "device plugin directory" in r.getMessage()])

    await until(lambda: not_there() >= 1, timeout=3, message="the missing directory logged")
    # several reconcile ticks while the directory is gone: logged once, not at every retry
    await stays(lambda: not_there() == 1, for_=1.0, message="the missing directory logged once")
    plugin_dir.mkdir()
    await kubelet.start()
    kubelet.resources.clear()
    view = await kubelet.wait_registered("iluvatar.com/vgpu", capacity=2, timeout=5)
    assert view.allocatable == 2


async def test_a_directory_where_the_socket_goes_is_retried_not_fatal(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, plugin_dir: Path
) -> None:
    daemon = await start_daemon("BI-V100:1")
    await kubelet.wait_registered(RESOURCE)
    socket_path = daemon.socket_path
    socket_path.unlink()
    socket_path.mkdir()  # someone puts a directory there
    await stays(lambda: not daemon.endpoint.serving, for_=0.8, message="not daemon.endpoint.serving")
    socket_path.rmdir()
    await kubelet.wait_for(lambda: daemon.endpoint.serving and daemon.registered, timeout=5)


# ---- 5. a hung GPU library is seen, and never blocks a stop ---------------------------------


class HangingBackend(SimulatedBackend):
    """A backend whose chosen call blocks until released, as a wedged libixml would."""

    def __init__(self, spec: str, hang: str) -> None:
        super().__init__(spec)
        self.hang = hang
        self.release = threading.Event()
        self.entered = threading.Event()

    def _maybe_hang(self, call: str) -> None:
        if call == self.hang:
            self.entered.set()
            self.release.wait(60)

    def discover(self):  # type: ignore[no-untyped-def]
        self._maybe_hang("discover")
        return super().discover()

    def health(self, inventory):  # type: ignore[no-untyped-def]
        self._maybe_hang("health")
        return super().health(inventory)


async def test_a_hung_health_call_fails_healthz_and_marks_chips_unhealthy(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    backend = HangingBackend("BI-V100:2", hang="health")
    daemon = await start_daemon(
        backend_factory=lambda: backend, health_interval=0.1, backend_timeout=0.3, health_address="127.0.0.1:0"
    )
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    try:
        await kubelet.wait_for(lambda: view.allocatable == 0, timeout=5)
        ok, reason = daemon.live()
        assert not ok and "health() has not returned" in reason
        assert all("did not return within 0.3s" in r or "has not returned" in r for r in daemon.plan.devices[0].reasons)
        started = time.monotonic()
        await daemon.shutdown()
        assert time.monotonic() - started < 2
        assert not daemon.socket_path.exists()
    finally:
        backend.release.set()


async def test_a_stop_during_a_hung_discovery_ends_within_2s(plugin_dir: Path, short_dir: Path) -> None:
    backend = HangingBackend("BI-V100:1", hang="discover")
    daemon = Daemon(
        Options(plugin_dir=plugin_dir, config_path=short_dir / "none", dev_root=short_dir, health_address="off"),
        backend_factory=lambda: backend,
    )
    running = asyncio.create_task(daemon.run())
    try:
        await asyncio.to_thread(backend.entered.wait, 5)
        started = time.monotonic()
        daemon.stop()
        async with asyncio.timeout(2):
            assert await running == 0
        assert time.monotonic() - started < 2
    finally:
        backend.release.set()


# ---- 6. counters count what happened, once ---------------------------------------------------


async def test_kubelet_restarts_count_once_and_warn_never(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    daemon = await start_daemon("BI-V100:1")
    await kubelet.wait_registered(RESOURCE)
    await until(lambda: daemon.registered)
    restarts = 20
    for _ in range(restarts):
        await kubelet.restart()
        await kubelet.wait_registered(RESOURCE, timeout=10)
        await until(lambda: daemon.registered, timeout=5)
    assert metric(daemon, "ix_device_plugin_reregistrations_total") == restarts
    assert metric(daemon, "ix_device_plugin_registrations_total") == restarts + 1
    assert metric(daemon, "ix_device_plugin_registration_failures_total") == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_kubelet_restart_seen_twice_registers_once(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, plugin_dir: Path
) -> None:
    """Polling can see the kubelet's socket vanish and come back in different passes: one registration."""
    from ix_device_plugin.kubelet.sockets import identity

    daemon = await start_daemon("BI-V100:1")
    await kubelet.wait_registered(RESOURCE)
    registrations = len(kubelet.registrations)
    same_kubelet = identity(plugin_dir / "kubelet.sock")
    assert same_kubelet is not None
    assert daemon.registrar.kubelet_restarted(same_kubelet) is False
    assert daemon.registered and len(kubelet.registrations) == registrations
    assert daemon.registrar.kubelet_restarted((0, 0)) is True  # another kubelet: register with it
    await until(lambda: len(kubelet.registrations) == registrations + 1 and daemon.registered)
