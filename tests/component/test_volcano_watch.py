"""Volcano mode follows the node's pods and its ConfigMap with watches: at rest it asks the API server nothing,
Allocate reads the watch's view, and the ConfigMap is written only when what it says changes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from helpers.support import RESOURCE
from helpers.volcano_support import (
    CHIP_A,
    CHIP_B,
    CONFIG_MAP,
    NAMESPACE,
    NODE,
    Volcano,
    devices,
    held,
    placed,
    published,
)
from helpers.waits import stays, until

from ix_device_plugin.apiserver.watch import Mirror
from ix_device_plugin.deviceplugin import features
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.deviceplugin.features.volcano import DEVICE_INFO_KEY, DEVICE_LIST_KEY, VolcanoMode
from ix_device_plugin.standins.apiserver import ApiServerStandIn, Recorded
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn


@pytest.fixture
def frequent_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass every 50 ms instead of every 5 s: whatever a pass asks at rest shows a hundredfold."""
    monkeypatch.setattr(features.volcano, "PASS_PERIOD", 0.05)


def _is_watch(request: Recorded) -> bool:
    return request.query.get("watch") == "true"


def _writes(requests: list[Recorded]) -> list[Recorded]:
    return [r for r in requests if r.method in ("POST", "PUT", "PATCH") and "/configmaps" in r.path]


def _pod_lists(requests: list[Recorded]) -> list[Recorded]:
    return [r for r in requests if r.path == "/api/v1/pods" and r.method == "GET" and not _is_watch(r)]


def _device_list(apiserver: ApiServerStandIn) -> list[str] | None:
    """DeviceListCfg's devices, None while the ConfigMap does not have a readable one."""
    found = apiserver.get("configmaps", CONFIG_MAP, NAMESPACE) or {"data": {}}
    try:
        return json.loads(found["data"].get(DEVICE_LIST_KEY, ""))["DeviceList"]
    except ValueError:
        return None


async def _started(volcano: Volcano) -> Daemon:
    """Started and registered, the ConfigMap written and both watches open."""
    daemon = await volcano.start()
    await until(lambda: DEVICE_INFO_KEY in published(volcano.apiserver), timeout=10)
    await volcano.apiserver.watching("pods", timeout=10)
    await volcano.apiserver.watching("configmaps", timeout=10)
    return daemon


async def test_at_rest_volcano_mode_asks_the_api_server_and_the_kubelet_nothing(
    volcano: Volcano, apiserver: ApiServerStandIn, pod_resources: PodResourcesStandIn, frequent_passes: None
) -> None:
    apiserver.add_pod("ml", "running", NODE, annotations=held(CHIP_A, "7"), limits={"main": {RESOURCE: "1"}})
    apiserver.add_pod("ml", "no-gpu", NODE)
    await _started(volcano)
    first, calls = len(apiserver.requests), pod_resources.calls
    await stays(
        lambda: [(r.method, r.path) for r in apiserver.requests[first:]] == [], for_=1.0, message="about 20 passes"
    )
    assert pod_resources.calls == calls  # every pod that needs devices has its annotations
    assert published(apiserver)[DEVICE_LIST_KEY]["DeviceList"] == [CHIP_B]  # A is held by the running pod
    assert len(_pod_lists(apiserver.requests)) == 1 and len(_writes(apiserver.requests)) == 1


async def test_only_what_changed_is_written_each_time_with_a_newer_update_time(
    volcano: Volcano, apiserver: ApiServerStandIn, tmp_path: Path
) -> None:
    await _started(volcano)
    before = published(apiserver)
    devices(tmp_path / "devices.yaml", unhealthy=(CHIP_B,))  # the simulated backend reads it at every poll
    await until(lambda: published(apiserver)[DEVICE_LIST_KEY]["DeviceList"] == [CHIP_A], timeout=10)
    after = published(apiserver)
    assert after[DEVICE_LIST_KEY]["UpdateTime"] > before[DEVICE_LIST_KEY]["UpdateTime"]
    assert after[DEVICE_INFO_KEY] == before[DEVICE_INFO_KEY]  # the GPUs and links are the same: not rewritten
    first, second = _writes(apiserver.requests)
    assert (first.method, set(first.body["data"])) == ("POST", {DEVICE_INFO_KEY, DEVICE_LIST_KEY})
    assert (second.method, set(second.body["data"])) == ("PATCH", {DEVICE_LIST_KEY})


async def test_a_deleted_or_edited_config_map_is_written_again(volcano: Volcano, apiserver: ApiServerStandIn) -> None:
    await _started(volcano)
    good = published(apiserver)
    apiserver.remove("configmaps", CONFIG_MAP, NAMESPACE)
    await until(lambda: DEVICE_INFO_KEY in published(apiserver), timeout=10)
    assert published(apiserver)[DEVICE_LIST_KEY]["DeviceList"] == good[DEVICE_LIST_KEY]["DeviceList"]
    edited = apiserver.get("configmaps", CONFIG_MAP, NAMESPACE)
    assert edited is not None
    edited["data"][DEVICE_LIST_KEY] = "not what the plugin wrote"
    apiserver.put("configmaps", edited)
    await until(lambda: _device_list(apiserver) == [CHIP_A, CHIP_B])
    assert [r.method for r in _writes(apiserver.requests)] == ["POST", "POST", "PATCH"]


async def test_a_restart_finding_the_config_map_current_writes_nothing(
    volcano: Volcano, apiserver: ApiServerStandIn
) -> None:
    daemon = await _started(volcano)
    await daemon.shutdown()
    first = len(apiserver.requests)
    await volcano.start()
    await until(lambda: sum(_is_watch(r) for r in apiserver.requests[first:]) >= 2, timeout=10)
    await stays(
        lambda: _writes(apiserver.requests[first:]) == [], for_=0.5, message="_writes(apiserver.requests[first:]) == []"
    )


async def test_allocate_reads_the_watch_and_waits_for_a_pod_placed_just_now(
    volcano: Volcano, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting, changed = asyncio.Event(), Mirror.changed

    async def noted(mirror: Mirror, timeout: float | None = None) -> bool:
        waiting.set()  # Allocate found no pod: it waits for the watch to bring one
        return await changed(mirror, timeout)

    monkeypatch.setattr(Mirror, "changed", noted)
    await _started(volcano)
    allocating = asyncio.create_task(kubelet.allocate(RESOURCE, [[CHIP_A]]))
    await waiting.wait()
    placed(apiserver, "just-now", CHIP_B, "10")
    response = await allocating
    assert response.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_B
    placed(apiserver, "next", CHIP_A, "11")
    response = await kubelet.allocate(RESOURCE, [[CHIP_B]])
    assert response.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_A
    assert len(_pod_lists(apiserver.requests)) == 1  # the watch's first read: Allocate lists nothing


async def test_allocate_without_a_view_of_the_pods_says_why(
    volcano: Volcano, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    await apiserver.refuse()
    await volcano.start()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    details = refused.value.details() or ""
    assert details.startswith(f"Volcano mode: the pods on node {NODE} are not known yet: list pods in every namespace")
    assert f"cannot reach the API server at {apiserver.url}" in details


async def test_watches_that_end_by_a_failure_are_started_again(
    volcano: Volcano, monkeypatch: pytest.MonkeyPatch, frequent_passes: None
) -> None:
    follow, failures = VolcanoMode.follow, []

    async def fails_once(mode: VolcanoMode) -> None:
        if not failures:
            failures.append("once")
            raise RuntimeError("a defect in a watch")
        await follow(mode)

    monkeypatch.setattr(VolcanoMode, "follow", fails_once)
    await _started(volcano)  # the ConfigMap is written only once both watches have read
    assert failures == ["once"]
