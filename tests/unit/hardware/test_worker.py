"""The backend worker: deadlines, and giving up on a hung call without holding up the calls after it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from helpers.waits import stays

from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.worker import BackendTimeout, Hardware


class Gate:
    """A backend whose `wait` call blocks until the gate opens."""

    name = "gate"

    def __init__(self) -> None:
        self.open = threading.Event()

    def wait(self) -> str:
        self.open.wait(10)
        return "late"

    def close(self) -> None:
        pass


async def test_an_abandoned_hung_call_leaves_later_calls_free_and_its_late_end_changes_nothing() -> None:
    gate = Gate()
    hardware = Hardware(lambda: gate, timeout=0.1)  # type: ignore[arg-type, return-value]
    with pytest.raises(BackendTimeout):
        await hardware.call("wait", lambda backend: backend.wait())
    with pytest.raises(BackendError, match="the previous backend call wait\\(\\) has not returned"):
        await hardware.call("quick", lambda backend: "now")
    assert hardware.abandon() and hardware.abandoned == 1
    assert await hardware.call("quick", lambda backend: "now") == "now"  # on a new thread
    release = threading.Event()

    def slow(backend: Any) -> str:
        release.wait(5)
        return "done"

    task = asyncio.ensure_future(hardware.call("slow", slow, timeout=5))
    await asyncio.sleep(0.05)
    gate.open.set()  # the abandoned call ends now, while another call runs
    await stays(
        lambda: hardware.running == "slow",
        for_=0.05,
        message="the abandoned call's late end left the running one as it was",
    )
    release.set()
    assert await task == "done"
    assert not hardware.abandon(), "nothing runs: nothing to give up on"
    await hardware.close(1.0)
