"""The hardware monitor's own timing: what a poll finds decides how often the chips are discovered again."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from helpers.waits import stays, until

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.hardware.backend import XidEvent, XidSink
from ix_device_plugin.hardware.monitor import MAX_XIDS, HardwareMonitor, MonitorSettings
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.hardware.worker import Hardware

BOARDS = """
boards:
  - product: BI-V100
    chips:
      - {present: %s}
  - product: BI-V100
"""


class CountingBackend(SimulatedBackend):
    """The simulated backend, counting discoveries."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.discoveries = 0

    def discover(self) -> Inventory:
        self.discoveries += 1
        return super().discover()

    def watch_xids(self, sink: XidSink) -> None:
        super().watch_xids(sink)
        self.xid_sink = sink  # the test plays the library's event thread


async def test_a_chip_that_stays_absent_is_looked_for_once_then_at_the_rediscovery_interval(tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text(BOARDS % "true")
    backend = CountingBackend(str(devices))
    settings = MonitorSettings(health_interval=0.02, rediscover_interval=3600, dev_root=tmp_path, watch_dev=False)
    monitor = HardwareMonitor(Hardware(lambda: backend, 5.0), settings)
    await monitor.start(fail_on_init_error=True)
    running = asyncio.create_task(monitor.run())
    try:
        devices.write_text(BOARDS % "false")
        await until(lambda: backend.discoveries >= 2, timeout=10, interval=0.01)
        # about 50 more polls, each finding the chip still absent
        await stays(
            lambda: backend.discoveries == 2,
            for_=1.0,
            message="the first discovery and one for the loss, not one per poll",
        )
        assert [chip.status.present for chip in monitor.inventory.chips()] == [False, True]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_an_xid_storm_is_summarised_in_a_few_log_lines_and_a_chip_keeps_a_bounded_set_of_xids(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin.hardware.monitor")
    devices = tmp_path / "devices.yaml"
    devices.write_text(BOARDS % "true")
    backend = CountingBackend(str(devices))
    taken: list[int] = []
    settings = MonitorSettings(health_interval=0.05, rediscover_interval=3600, dev_root=tmp_path, watch_dev=False)
    monitor = HardwareMonitor(Hardware(lambda: backend, 5.0), settings, on_xid=taken.append)
    await monitor.start(fail_on_init_error=True)
    running = asyncio.create_task(monitor.run())
    first, second = (chip.uuid for chip in monitor.inventory.chips())
    storm = [XidEvent(first, 13)] * 20_000  # an application XID, over and over
    storm += [XidEvent(second, 100 + n) for n in range(5_000)]  # a broken driver's distinct critical XIDs
    storm += [XidEvent("GPU-not-here", 79)] * 1_000
    storm += [XidEvent(f"GPU-gone-{n}", 79) for n in range(1_000)]  # chips not served, each once
    try:
        await asyncio.to_thread(lambda: [backend.xid_sink(event) for event in storm])  # the backend's thread
        await until(lambda: len(taken) >= len(storm), timeout=20, interval=0.01)
        assert len(monitor.inventory.statuses()[second].xids) == MAX_XIDS
        lines = [r for r in caplog.records if r.name == "ix_device_plugin.hardware.monitor"]
        assert len(lines) < 100, f"{len(lines)} log lines for {len(storm)} events"
        monitor.xid_log.flush(force=True)
        text = caplog.text
        assert f"XID 13 on {first} ignored" in text and "(19999 more times in " in text and ", the last at " in text
        assert "(999 more times in " in text  # the chip not served
        assert "more events of other kinds" in text
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
