"""The DRA driver's node services (node labels; GPU telemetry with the pods and claims holding each chip): what
they cost.

The driver as its own process on 16 BI-V150 boards (32 chips, 48 devices) against the API-server and
pod-resources stand-ins, half the chips held by claims of one pod each, scraped once as Prometheus would: its
resident memory and idle CPU with telemetry on at its default interval (15 s) and off (node labels on in both),
and how many pod-resources `List` calls it makes a minute.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import urllib.request
from typing import Any

from bench import procfs
from bench.dra import NODE, START_TIMEOUT, _command
from bench.footprint import idle_cpu_percent
from bench.plugin import short_dir, stop_process
from bench.settings import Settings
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.podresources import ClaimResource, PodClaim, PodResourcesStandIn
from ix_device_plugin.standins.waits import until

BOARDS = 16
TELEMETRY_INTERVAL = "15"  # the default
CALLS_WINDOW = 60.0  # seconds of counting pod-resources calls (the full run; a smoke run counts idle_seconds)


async def run(settings: Settings) -> dict[str, Any]:
    """RSS and idle CPU with telemetry off and on; pod-resources calls a minute with it on."""
    async with ApiServerStandIn() as api:
        off = await _measure(api, settings, telemetry=False)
        on = await _measure(api, settings, telemetry=True)
    return {
        "chips": BOARDS * 2,
        "telemetry_off": off,
        "telemetry_on": on,
        "rss_added_by_telemetry_mib": round(on["rss_mib"] - off["rss_mib"], 2),
        "pod_resources_calls_per_minute": on["pod_resources_calls_per_minute"],
    }


async def _measure(api: ApiServerStandIn, settings: Settings, telemetry: bool) -> dict[str, Any]:
    directory = short_dir()
    pod_resources = PodResourcesStandIn(directory / "pod-resources" / "kubelet.sock")
    await pod_resources.start()
    node = f"{NODE}-{'on' if telemetry else 'off'}"
    pod_resources.claims = {  # half the chips (gpu-0 ... gpu-15) held by a claim each
        ("bench", f"pod-{minor}"): {"main": [PodClaim(f"claim-{minor}", (_resource(node, minor),))]}
        for minor in range(BOARDS)
    }
    port = _free_port()
    command = _command(directory, api.write_kubeconfig(directory / "kubeconfig"), node)
    command += ["--simulated-devices", f"BI-V150:{BOARDS}", "--node-feature-dir", str(directory / "features.d")]
    command += ["--pod-resources-socket", str(pod_resources.socket_path), "--health-address", f"127.0.0.1:{port}"]
    command += ["--telemetry-interval", TELEMETRY_INTERVAL if telemetry else "off"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await _wait_for(lambda: (directory / "features.d" / "ix-device-plugin").exists(), "the node labels")
        if telemetry:
            await _wait_for(lambda: "ix_gpu_temperature" in _scrape(port), "the GPU metrics")
        _scrape(port)  # Prometheus scrapes every agent: its client library is loaded in both
        await asyncio.sleep(settings.settle_seconds)
        window = CALLS_WINDOW if not settings.smoke else settings.idle_seconds
        calls = pod_resources.calls
        idle = await idle_cpu_percent(process.pid, window)
        calls = pod_resources.calls - calls
        return {
            "rss_mib": procfs.rss_mib(process.pid),
            "threads": procfs.threads(process.pid),
            "idle_seconds": window,
            "idle_cpu_percent": idle,
            "pod_resources_calls": calls,
            "pod_resources_calls_per_minute": round(calls * 60 / window, 2),
        }
    finally:
        await stop_process(process)
        await pod_resources.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _resource(node: str, minor: int) -> ClaimResource:
    return ClaimResource(DRIVER, node, f"gpu-{minor}", (f"{DRIVER}/claim=bench-{minor}",))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return ""


async def _wait_for(predicate: Any, what: str) -> None:
    """Wait until predicate() (a look at the driver's files or its metrics, made off the loop) holds."""
    await until(
        lambda: asyncio.to_thread(predicate), timeout=START_TIMEOUT, interval=0.05, message=f"the DRA driver's {what}"
    )
