"""Supervised tasks: a task that fails is started again after growing delays, and the log says the delay it waits."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from ix_device_plugin.runtime import service
from ix_device_plugin.runtime.service import Supervised


def said_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [
        float(match.group(1))
        for record in caplog.records
        if (match := re.search(r"starting it again in ([0-9.]+)s", record.getMessage()))
    ]


async def test_a_failing_task_waits_longer_each_time_and_after_a_healthy_run_starts_over(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(service, "RESTART_FIRST", 0.1)
    monkeypatch.setattr(service, "RESTART_CAP", 0.4)
    monkeypatch.setattr(service, "HEALTHY_RUN", 0.5)
    runs = iter([0.0, 0.0, 0.0, 0.0, 0.6, 0.0])  # how long each run lasts before it fails
    finished = asyncio.Event()

    async def task() -> None:
        seconds = next(runs, None)
        if seconds is None:
            finished.set()
            await asyncio.Event().wait()
        await asyncio.sleep(seconds)
        raise RuntimeError("broken")

    caplog.set_level(logging.ERROR, logger="ix_device_plugin.runtime.service")
    supervised = Supervised("demo", task)
    try:
        async with asyncio.timeout(10):
            await finished.wait()
    finally:
        supervised.task.cancel()
        await asyncio.gather(supervised.task, return_exceptions=True)
    # 0.1, 0.2, 0.4, then capped at 0.4; the fifth run lasted longer than HEALTHY_RUN, so its delay is the
    # first again, and the log says the delay actually waited.
    assert said_delays(caplog) == [0.1, 0.2, 0.4, 0.4, 0.1, 0.2]
    assert supervised.restarts == 6
