"""Critical XID events from IXML's event API (nvmlEventSetWait_v2), over the compiled libixml.so double."""

from __future__ import annotations

import ctypes
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.support import RESOURCE, TWO_CHIPS, DaemonFactory, inject_xid, metric
from helpers.waits import stays, stays_sync, until, until_sync

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.core.inventory import ChipStatus
from ix_device_plugin.hardware.backend import BackendError, XidEvent
from ix_device_plugin.hardware.ixml import IxmlBackend
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import resolve
from ix_device_plugin.settings.table import RUN
from ix_device_plugin.standins.kubelet import KubeletStandIn

XID_EVENTS = "ix_device_plugin_xid_events_total"
LAST_POLL = "ix_device_plugin_last_health_poll_timestamp_seconds"


class Sink:
    """Collects XID events handed over by the backend's thread."""

    def __init__(self) -> None:
        self.events: list[XidEvent] = []
        self.threads: set[str] = set()
        self._arrived = threading.Condition()

    def __call__(self, event: XidEvent) -> None:
        with self._arrived:
            self.events.append(event)
            self.threads.add(threading.current_thread().name)
            self._arrived.notify_all()

    def wait(self, count: int, timeout: float = 3.0) -> list[XidEvent]:
        with self._arrived:
            self._arrived.wait_for(lambda: len(self.events) >= count, timeout)
            return list(self.events)


def waiting_backend(library: Path, sink: Sink) -> IxmlBackend:
    backend = IxmlBackend(str(library), dev_root="/nonexistent")
    backend.watch_xids(sink)
    backend.discover()
    return backend


def shutdown_while_waiting(library: Path) -> int:
    return int(ctypes.CDLL(str(library)).ixml_double_shutdown_while_waiting())


def waiting_now(library: Path) -> int:
    """How many threads are inside the double's nvmlEventSetWait_v2."""
    return int(ctypes.CDLL(str(library)).ixml_double_waiting())


def test_an_xid_reaches_the_sink_from_a_thread_of_its_own(libs: dict[str, Path], conf: Path) -> None:
    sink = Sink()
    backend = waiting_backend(libs["full"], sink)
    try:
        inject_xid(conf, 1, 79)
        assert sink.wait(1) == [XidEvent(uuid="GPU-x1", xid=79)]
        assert sink.threads == {"ix-xid-events"}
    finally:
        backend.close()


def test_close_stops_the_waiter_promptly_and_never_shuts_down_under_it(libs: dict[str, Path], conf: Path) -> None:
    backend = waiting_backend(libs["full"], Sink())
    until_sync(lambda: waiting_now(libs["full"]), message="the waiter inside nvmlEventSetWait_v2")
    started = time.monotonic()
    backend.close()
    assert time.monotonic() - started < 1.5
    assert not any(thread.name == "ix-xid-events" for thread in threading.enumerate())
    assert shutdown_while_waiting(libs["full"]) == 0


def test_the_waiter_is_registered_again_after_a_close(libs: dict[str, Path], conf: Path) -> None:
    sink = Sink()
    backend = waiting_backend(libs["full"], sink)
    backend.close()  # as reset() does before ixsmi -r
    backend.discover()
    try:
        inject_xid(conf, 0, 48)
        assert sink.wait(1) == [XidEvent(uuid="GPU-x0", xid=48)]
    finally:
        backend.close()


def test_a_reset_stops_the_waiter_and_a_rediscovery_watches_new_chips(libs: dict[str, Path], conf: Path) -> None:
    sink = Sink()
    backend = IxmlBackend(str(libs["full"]), dev_root="/nonexistent", ixsmi_path="/bin/true")
    backend.watch_xids(sink)
    backend.discover()
    backend.reset(["GPU-x0"], timeout=5)
    assert not any(thread.name == "ix-xid-events" for thread in threading.enumerate())
    assert shutdown_while_waiting(libs["full"]) == 0
    backend.discover()  # waits again, for the two chips
    conf.write_text(TWO_CHIPS + 'device uuid=GPU-x2 name="Iluvatar BI-V100" minor=2 bus=00000000:8C:00.0\n')
    backend.discover()
    try:
        inject_xid(conf, 2, 94)
        assert sink.wait(1) == [XidEvent(uuid="GPU-x2", xid=94)]
    finally:
        backend.close()


HUNG_WAIT_SCRIPT = """
import ctypes, logging, sys, time
from ix_device_plugin.hardware.ixml import IxmlBackend
from ix_device_plugin.hardware.simulated import SimulatedBackend
logging.basicConfig(level=logging.INFO, format="%(message)s")
backend = IxmlBackend(sys.argv[1], dev_root="/nonexistent")
backend.watch_xids(lambda event: None)
backend.discover()
time.sleep(0.1)
started = time.monotonic()
backend.close()
print(f"closed in {time.monotonic() - started:.1f}s")
print("shutdown while waiting:", ctypes.CDLL(sys.argv[1]).ixml_double_shutdown_while_waiting())
"""


def test_a_wait_that_never_returns_keeps_the_library_from_being_shut_down_under_it(
    libs: dict[str, Path], conf: Path
) -> None:
    """Run in a process of its own: the hung waiter thread would stay inside this one's copy of the double."""
    conf.write_text(TWO_CHIPS + "hang_wait=1\n")
    done = subprocess.run(
        [sys.executable, "-c", HUNG_WAIT_SCRIPT, str(libs["full"])], capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "shutdown while waiting: 0" in done.stdout
    seconds = float(done.stdout.split("closed in ")[1].split("s")[0])
    assert seconds < 3
    assert "the XID event waiter did not return from nvmlEventSetWait_v2; IXML is left initialised" in done.stderr


def test_without_the_event_calls_health_is_polled_only_said_once(
    libs: dict[str, Path], conf: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = Sink()
    backend = waiting_backend(libs["no_events"], sink)
    backend.discover()
    inject_xid(conf, 0, 79)

    def notes() -> list[str]:
        return [r.getMessage() for r in caplog.records if "no IXML XID events" in r.getMessage()]

    until_sync(notes, timeout=3, message="the note that XID events are polled")
    stays_sync(lambda: len(notes()) == 1, for_=0.2, message="the note said once")
    backend.close()
    said = notes()
    assert "lacks nvmlEventSetCreate" in said[0] and "polling alone" in said[0]
    assert sink.events == []


def test_chips_that_do_not_support_events_are_left_to_polling(
    libs: dict[str, Path], conf: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    conf.write_text(TWO_CHIPS.replace("minor=0 ", "minor=0 unsupported=events "))
    sink = Sink()
    backend = waiting_backend(libs["full"], sink)
    try:
        inject_xid(conf, 0, 79)  # on the chip without events: not delivered
        inject_xid(conf, 1, 74)
        assert sink.wait(1) == [XidEvent(uuid="GPU-x1", xid=74)]
        assert "not supported on GPU-x0" in caplog.text
    finally:
        backend.close()
    conf.write_text(TWO_CHIPS.replace(" bus=", " unsupported=events bus="))
    caplog.clear()
    backend = waiting_backend(libs["full"], sink)
    backend.discover()
    backend.close()
    assert sum("no IXML XID events" in r.getMessage() for r in caplog.records) == 1


def test_a_rediscovery_keeps_the_waiter_when_a_chip_without_events_is_still_there(
    libs: dict[str, Path], conf: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    conf.write_text(TWO_CHIPS.replace("minor=0 ", "minor=0 unsupported=events "))
    sink = Sink()
    backend = waiting_backend(libs["full"], sink)
    try:
        backend.discover()
        backend.discover()
        inject_xid(conf, 1, 74)
        assert sink.wait(1) == [XidEvent(uuid="GPU-x1", xid=74)]
    finally:
        backend.close()
    said = [r.getMessage() for r in caplog.records if "not supported on GPU-x0" in r.getMessage()]
    assert len(said) == 1, "the event set is registered once, not stopped and made again at every discovery"


def test_xid_reasons_and_the_ignored_set() -> None:
    status = ChipStatus(errors=frozenset({"ECC"}), xids=frozenset({79, 13}))
    assert status.reasons() == ("ECC", "XID 79")  # 13 is an application XID, ignored by default
    assert status.reasons(frozenset({"XID 79"})) == ("ECC",)
    assert status.reasons(frozenset({"xids"})) == ("ECC",)
    assert status.reasons(frozenset({"all"})) == ()
    assert status.with_xids(frozenset({79})) is status


@pytest.mark.parametrize(
    ("text", "ignored"),
    [("xids", {"xids"}), ("79, xid48,XID 63", {"XID 79", "XID 48", "XID 63"}), ("ECC,94", {"ECC", "XID 94"})],
)
def test_disable_healthchecks_takes_xids(text: str, ignored: set[str]) -> None:
    assert resolve(RUN, {}, {"IX_DISABLE_HEALTHCHECKS": text})["disabled_healthchecks"] == ignored


@pytest.mark.parametrize("text", ["xid-1", "0", "\uff14\uff12", "99999999999"])
def test_disable_healthchecks_refuses_what_is_no_xid(text: str) -> None:
    with pytest.raises(SettingsError, match=r"^environment variable IX_DISABLE_HEALTHCHECKS: unknown check"):
        resolve(RUN, {}, {"IX_DISABLE_HEALTHCHECKS": text})


async def test_xid_while_a_container_runs_turns_its_device_unhealthy(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, libs: dict[str, Path], conf: Path, short_dir: Path
) -> None:
    (short_dir / "dev").mkdir()
    for minor in (0, 1):
        (short_dir / "dev" / f"iluvatar{minor}").touch()
    daemon = await start_daemon(
        backend_factory=lambda: IxmlBackend(str(libs["full"]), dev_root=short_dir), health_interval=0.1
    )
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    assert set(view.devices.values()) == {HEALTHY}
    await kubelet.allocate(RESOURCE, [["GPU-x1"]])  # a container now holds GPU-x1

    inject_xid(conf, 1, 13)  # an application XID: ignored by default, counted
    inject_xid(conf, 1, 79)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    assert view.devices["GPU-x0"] == HEALTHY
    device = daemon.plan.by_id["GPU-x1"]
    assert device.reasons == ("GPU-x1: XID 79",)
    await until(lambda: metric(daemon, XID_EVENTS, xid="13") == 1, timeout=3.0)
    assert metric(daemon, XID_EVENTS, xid="79") == 1

    polls = metric(daemon, LAST_POLL)
    await until(lambda: metric(daemon, LAST_POLL) > polls, timeout=3.0)
    # the reconcile loop applies that poll
    await stays(lambda: view.devices["GPU-x1"] == UNHEALTHY, for_=0.05, message="later polls do not clear it")
    assert daemon.plan.by_id["GPU-x1"].reasons == ("GPU-x1: XID 79",)


async def test_an_xid_listed_in_disable_healthchecks_leaves_the_device_healthy(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    libs: dict[str, Path],
    conf: Path,
    short_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    (short_dir / "dev").mkdir()
    for minor in (0, 1):
        (short_dir / "dev" / f"iluvatar{minor}").touch()
    daemon = await start_daemon(
        backend_factory=lambda: IxmlBackend(str(libs["full"]), dev_root=short_dir),
        ignored_health_errors=frozenset({"XID 79"}),
    )
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    inject_xid(conf, 0, 79)
    await until(lambda: metric(daemon, XID_EVENTS, xid="79") == 1, timeout=3.0)
    assert view.devices["GPU-x0"] == HEALTHY
    assert daemon.plan.by_id["GPU-x0"].healthy
    assert "XID 79 on GPU-x0 ignored" in caplog.text


SIMULATED = """boards:
  - product: BI-V100
    chips: [{{uuid: GPU-s0, minor: 0{xids}}}]
  - product: BI-V100
    chips: [{{uuid: GPU-s1, minor: 1}}]
"""


async def test_simulated_xids_reach_the_kubelet_once_each(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    devices = short_dir / "devices.yaml"
    devices.write_text(SIMULATED.format(xids=""))
    daemon = await start_daemon(str(devices), health_interval=0.05)
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    allocated = await kubelet.allocate(RESOURCE, [["GPU-s0"]])
    assert allocated.container_responses[0].devices
    devices.write_text(SIMULATED.format(xids=", xids: [31, 62]"))
    await kubelet.wait_for(lambda: view.devices["GPU-s0"] == UNHEALTHY, timeout=3)
    assert daemon.plan.by_id["GPU-s0"].reasons == ("GPU-s0: XID 62",)  # 31 is an application XID
    assert view.devices["GPU-s1"] == HEALTHY
    devices.write_text(SIMULATED.format(xids=""))  # the file no longer says so; the XID stays
    polls = metric(daemon, LAST_POLL)
    await until(lambda: metric(daemon, LAST_POLL) > polls + 0.1, timeout=3.0)
    assert view.devices["GPU-s0"] == UNHEALTHY
    assert metric(daemon, XID_EVENTS, xid="62") == 1


def test_simulated_xids_must_be_xid_numbers(short_dir: Path) -> None:
    devices = short_dir / "devices.yaml"
    devices.write_text(SIMULATED.format(xids=", xids: [seventy-nine]"))
    with pytest.raises(BackendError, match=r"chips\[0\]\.xids: expected a list of XID numbers"):
        SimulatedBackend(str(devices)).discover()
