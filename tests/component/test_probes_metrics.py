"""/healthz, /readyz and /metrics over real HTTP, checked against what happened."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from helpers.support import RESOURCE, DaemonFactory, config_flags, metric
from helpers.waits import stays, until
from prometheus_client.parser import text_string_to_metric_families

from ix_device_plugin import __version__
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.standins.kubelet import KubeletStandIn


def get(daemon: Daemon, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{daemon.node.probe_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def fetch(daemon: Daemon, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(get, daemon, path)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


async def test_probes_follow_registration(plugin_dir: Path, start_daemon: DaemonFactory) -> None:
    daemon = await start_daemon("BI-V100:2", health_address="127.0.0.1:0", registration_grace=0.5)
    status, body = await fetch(daemon, "/readyz")
    assert (status, body) == (503, "not ok: not registered with the kubelet\n")

    # No kubelet.sock yet: waiting for the kubelet is not a failure, restarting the plugin would not help.
    async def live() -> bool:
        return (await fetch(daemon, "/healthz"))[0] == 200

    await stays(live, for_=0.8, message="/healthz answering 200 while the kubelet is absent")
    kubelet = KubeletStandIn(plugin_dir)
    original = kubelet.Register
    refusing = True

    async def refuse_at_first(request, context):  # type: ignore[no-untyped-def]
        if refusing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is starting")
        return await original(request, context)

    kubelet.Register = refuse_at_first  # type: ignore[method-assign]
    await kubelet.start()

    async def failing() -> bool:
        status, body = await fetch(daemon, "/healthz")
        return status == 503 and "registration failing" in body

    await until(failing, timeout=5, message="/healthz failing on the refused registrations")
    refusing = False
    try:
        await kubelet.wait_registered(RESOURCE, timeout=10)  # after a backoff of up to 5 s
        await until(lambda: daemon.registered)
        assert (await fetch(daemon, "/readyz"))[0] == 200
        status, body = await fetch(daemon, "/healthz")
        assert status == 200 and "serving 2 iluvatar.com/gpu" in body
        assert (await fetch(daemon, "/nope"))[0] == 404
    finally:
        await kubelet.stop()


async def test_healthz_fails_when_the_socket_is_gone(kubelet: KubeletStandIn, start_daemon: DaemonFactory) -> None:
    daemon = await start_daemon("BI-V100:1", health_address="127.0.0.1:0")
    await kubelet.wait_registered(RESOURCE)
    assert (await fetch(daemon, "/healthz"))[0] == 200
    await daemon.service.stop_tasks(timeout=1)  # a wedged daemon: nothing brings the server back
    await daemon.endpoint.stop(grace=0)
    status, body = await fetch(daemon, "/healthz")
    assert status == 503 and "not serving" in body


async def test_metrics_tell_what_happened(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    devices = short_dir / "devices.yaml"
    devices.write_text(
        "boards:\n  - product: BI-V150\n    chips:\n      - {}\n      - health: [ECC, OverTemp]\n  - product: BI-V100\n"
    )
    daemon = await start_daemon(str(devices), health_address="127.0.0.1:0", given=config_flags(replicas="2"))
    view = await kubelet.wait_registered(RESOURCE, capacity=4)
    healthy = [device_id for device_id, health in view.devices.items() if health == "Healthy"]
    await kubelet.allocate(RESOURCE, [[healthy[0]]])
    await kubelet.preferred(RESOURCE, healthy, [], 1)
    with pytest.raises(grpc.aio.AioRpcError):
        await kubelet.allocate(RESOURCE, [["GPU-nope"]])
    await kubelet.restart()
    await kubelet.wait_registered(RESOURCE, capacity=4, timeout=3)
    await until(lambda: daemon.registered and metric(daemon, "ix_device_plugin_last_health_poll_timestamp_seconds") > 0)
    status, text = await fetch(daemon, "/metrics")
    assert status == 200
    values = samples(text)
    assert values[("ix_device_plugin_devices", (("health", "Healthy"), ("resource", RESOURCE)))] == 2
    assert values[("ix_device_plugin_devices", (("health", "Unhealthy"), ("resource", RESOURCE)))] == 2
    assert values[("ix_device_plugin_chip_health_errors", (("error", "ECC"),))] == 1
    assert values[("ix_device_plugin_chip_health_errors", (("error", "OverTemp"),))] == 1
    assert values[("ix_device_plugin_chip_health_errors", (("error", "PCIE"),))] == 0
    assert values[("ix_device_plugin_chips", (("state", "present"),))] == 3
    assert values[("ix_device_plugin_registrations_total", ())] == 2
    assert values[("ix_device_plugin_reregistrations_total", ())] >= 1
    assert values[("ix_device_plugin_registered", ())] == 1
    assert values[("ix_device_plugin_calls_total", (("method", "Allocate"),))] == 2
    assert values[("ix_device_plugin_calls_total", (("method", "GetPreferredAllocation"),))] == 1
    assert values[("ix_device_plugin_call_errors_total", (("code", "INVALID_ARGUMENT"), ("method", "Allocate")))] == 1
    assert values[("ix_device_plugin_call_duration_seconds_count", (("method", "Allocate"),))] == 2
    assert values[("ix_device_plugin_last_health_poll_timestamp_seconds", ())] > 1.7e9
    assert values[("ix_device_plugin_build_info", (("version", __version__),))] == 1
