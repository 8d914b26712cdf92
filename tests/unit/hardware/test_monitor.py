"""The hardware monitor's own timing: what a poll finds decides how often the chips are discovered again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.hardware.monitor import HardwareMonitor, MonitorSettings
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
        async with asyncio.timeout(10):
            while backend.discoveries < 2:
                await asyncio.sleep(0.01)
        await asyncio.sleep(1.0)  # about 50 more polls, each finding the chip still absent
        assert backend.discoveries == 2, "the first discovery and one for the loss, not one per poll"
        assert [chip.status.present for chip in monitor.inventory.chips()] == [False, True]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
