"""The kubelet's pod-resources answer is read within a cap: a larger one is refused, naming the socket and why."""

from __future__ import annotations

import logging
import tracemalloc
from pathlib import Path

import pytest

from ix_device_plugin.kubelet.podresources import MAX_MESSAGE, PodResources, list_allocations
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.standins.podresources import PodResourcesStandIn

RESOURCE = "iluvatar.com/gpu"


async def test_an_answer_over_the_cap_is_refused_and_telemetry_goes_without_pod_labels(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    standin = PodResourcesStandIn(short_dir / "pod-resources" / "kubelet.sock")
    ids = [f"GPU-{index:036d}" for index in range(MAX_MESSAGE // 40 + 1000)]  # a little over 4 MiB
    standin.pods = {("ml", "huge"): {"main": {RESOURCE: ids}}}
    await standin.start()
    reader = PodResources(standin.socket_path)
    try:
        tracemalloc.start()
        try:
            assert await reader.allocations({RESOURCE}, OncePerError(logging.getLogger("test"))) == {}
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        standin.pods = {("ml", "small"): {"main": {RESOURCE: ["GPU-a"]}}}
        assert list(await list_allocations(standin.socket_path, {RESOURCE}, 2.0)) == ["GPU-a"]
    finally:
        await reader.close()
        await standin.stop()
    message = next(r.getMessage() for r in caplog.records if "pod resources" in r.getMessage())
    assert f"pod resources {standin.socket_path}: the answer is over the 4 MiB allowed" in message, message
    assert peak < 16 * 1024 * 1024, peak  # the stand-in's own message included
