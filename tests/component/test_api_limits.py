"""The API server's answers are read within caps: too large (declared or streamed), compressed, endless events."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from pathlib import Path

import pytest
from helpers.waits import until

from ix_device_plugin.apiserver import limits
from ix_device_plugin.apiserver.client import Kube, connect
from ix_device_plugin.apiserver.connection import ApiConnection
from ix_device_plugin.apiserver.errors import KubeError
from ix_device_plugin.apiserver.objects import CONFIG_MAP, POD, pod_doc
from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.apiserver.watch import Mirror
from ix_device_plugin.standins.apiserver import ApiServerStandIn, bodies

NODE = "gpu-node-1"
NS = "kube-system"


@pytest.fixture
async def kube(apiserver: ApiServerStandIn, tmp_path: Path):  # type: ignore[no-untyped-def]
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    client = await connect(settings_from({"NODE_NAME": NODE}, str(kubeconfig), "flags.usevolcano"))
    yield client
    await client.close()


@pytest.fixture
def small_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Caps of 1 MiB, so that reaching them takes milliseconds (the bench runs the real ones)."""
    for name in ("OBJECT_CAP", "LIST_CAP", "WATCH_EVENT_CAP"):
        monkeypatch.setattr(limits, name, limits.MIB)
    from ix_device_plugin.apiserver import client, events

    monkeypatch.setattr(client, "OBJECT_CAP", limits.MIB)
    monkeypatch.setattr(client, "LIST_CAP", limits.MIB)
    monkeypatch.setattr(events, "WATCH_EVENT_CAP", limits.MIB)


async def refusal(call, *args, **kwargs) -> tuple[str, float, int]:  # type: ignore[no-untyped-def]
    """The KubeError call(*args) raises, how long it took, and the peak of memory traced meanwhile."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(KubeError) as refused:
            await call(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return str(refused.value), time.monotonic() - started, peak


async def test_a_list_that_never_ends_is_refused_at_the_cap_naming_it(
    apiserver: ApiServerStandIn, kube: Kube, small_caps: None
) -> None:
    apiserver.bodies = bodies.ENDLESS
    message, seconds, peak = await refusal(kube.list_pods, field_selector={"spec.nodeName": NODE})
    assert message == (
        "list pods in every namespace: the API server's answer is over the 1 MiB allowed; "
        "refused after reading that much"
    )
    assert seconds < 5 and peak < 8 * limits.MIB, (seconds, peak)
    apiserver.bodies = None
    assert await kube.list_pods(field_selector={"spec.nodeName": NODE}) == []  # and the connection still serves


async def test_an_object_declaring_300_mb_is_refused_unread_with_the_real_cap(
    apiserver: ApiServerStandIn, kube: Kube
) -> None:
    apiserver.bodies = bodies.DECLARED
    message, seconds, peak = await refusal(kube.get_config_map, NS, "ix-gpu-reset-gpu-node-1")
    assert message == (
        f"get configmap {NS}/ix-gpu-reset-gpu-node-1: the API server's answer is 300,000,000 bytes "
        "(Content-Length), over the 4 MiB allowed; refused unread"
    )
    assert seconds < 5 and peak < 2 * limits.MIB, (seconds, peak)
    message, _, _ = await refusal(kube.list_objects, POD)
    assert "over the 16 MiB allowed; refused unread" in message


async def test_a_compressed_answer_nobody_asked_for_is_refused(apiserver: ApiServerStandIn, kube: Kube) -> None:
    apiserver.bodies = bodies.COMPRESSED
    message, _, peak = await refusal(kube.get_object, CONFIG_MAP, "any", NS)
    assert message.endswith("the API server's answer is compressed (gzip) although none was asked for")
    assert peak < 2 * limits.MIB
    assert apiserver.requests[-1].query.get("watch") is None


async def test_a_watch_event_that_never_ends_ends_the_watch_at_the_cap(
    apiserver: ApiServerStandIn, kube: Kube, small_caps: None
) -> None:
    apiserver.bodies = bodies.ENDLESS_EVENT

    async def watch() -> None:
        async for _ in kube.watch(POD, "1", field_selector={"spec.nodeName": NODE}):
            pass

    message, seconds, peak = await refusal(watch)
    assert message == (
        "watch pods in every namespace (spec.nodeName=gpu-node-1): one event of the watch is over the 1 MiB "
        "allowed; refused after reading that much"
    )
    assert seconds < 5 and peak < 8 * limits.MIB, (seconds, peak)


async def test_a_watch_that_brings_more_objects_than_a_node_has_keeps_none_and_says_why(
    apiserver: ApiServerStandIn, tmp_path: Path
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    api = ApiConnection(settings_from({"NODE_NAME": NODE}, str(kubeconfig), "flags.usevolcano"))
    mirror = Mirror(api, POD, pod_doc, "pods", field_selector={"spec.nodeName": NODE}, max_items=3)
    task = asyncio.create_task(mirror.run())
    try:
        await mirror.changed(timeout=5)
        for index in range(4):  # one at a time, through the watch
            apiserver.add_pod("ml", f"p{index}", NODE)
        await until(lambda: mirror.problem, timeout=5)
        assert mirror.problem == "the API server sent more than 3 objects; none kept"
        assert len(mirror.items) == 3
    finally:
        task.cancel()
        await api.close()
