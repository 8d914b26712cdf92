"""DRA mode: start-up (process start -> registration served, and -> ResourceSlice published), prepare and
unprepare latency through the kubelet DRA stand-in, and the driver's RSS, on 2 BI-V150 boards (4 chips).

The driver is `ix-device-plugin dra` in its own process, on simulated devices, against the API server stand-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.plugin import short_dir
from bench.procfs import rss_mib
from bench.stats import latency_ms, summary_ms
from ix_device_plugin.dra.pool import slice_base_name
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.dra_kubelet import DraKubeletStandIn

NODE = "bench-node"
START_TIMEOUT = 15.0


def _command(directory: Path, kubeconfig: Path, node: str) -> list[str]:
    return [
        sys.executable, "-m", "ix_device_plugin", "dra",
        "--backend", "simulated", "--simulated-devices", "BI-V150:2",
        "--node-name", node, "--kubeconfig", str(kubeconfig),
        "--kubelet-registrar-directory-path", str(directory / "registry"),
        "--kubelet-plugins-directory-path", str(directory / "plugins"),
        "--cdi-spec-dir", str(directory / "cdi"), "--dev-root", str(directory),
        "--log-level", "warning",
    ]  # fmt: skip


async def _wait(predicate: Any, what: str) -> None:
    async with asyncio.timeout(START_TIMEOUT):
        while not predicate():
            await asyncio.sleep(0.002)


def _claim(api: ApiServerStandIn, node: str, device: str) -> tuple[str, str, str]:
    uid, name = str(uuid.uuid4()), f"claim-{uuid.uuid4().hex[:8]}"
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
    api.put(
        "resourceclaims",
        {
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "status": {"allocation": {"devices": {"results": [result]}}},
        },
    )
    return "default", name, uid


async def _run_once(api: ApiServerStandIn, prepares: int, node: str) -> dict[str, Any]:
    directory = short_dir()
    kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
    socket = directory / "registry" / f"{DRIVER}-reg.sock"
    name = slice_base_name(node)  # a node per start: each start publishes its slice afresh
    started = time.perf_counter()
    process = subprocess.Popen(_command(directory, kubeconfig, node), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        kubelet = DraKubeletStandIn(DRIVER)
        await _wait(socket.is_socket, "registration socket")
        await kubelet.register(socket)
        registered = time.perf_counter() - started
        await _wait(lambda: api.get("resourceslices", name) is not None, "ResourceSlice")
        published = time.perf_counter() - started
        rss_start = rss_mib(process.pid)
        prepare, unprepare = [], []
        for index in range(prepares):
            claim = _claim(api, node, f"gpu-{index % 4}")
            begin = time.perf_counter()
            response = await kubelet.prepare([claim])
            prepare.append(time.perf_counter() - begin)
            assert response.claims[claim[2]].error == "", response.claims[claim[2]].error
            begin = time.perf_counter()
            await kubelet.unprepare([claim])
            unprepare.append(time.perf_counter() - begin)
        rss_after = rss_mib(process.pid)
        await kubelet.close()
        return {
            "registered": registered,
            "published": published,
            "prepare": prepare,
            "unprepare": unprepare,
            "rss_start": rss_start,
            "rss_after": rss_after,
        }
    finally:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        if process.poll() is None:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


async def run(settings: Any) -> dict[str, Any]:
    """Start-ups, prepare/unprepare round trips and RSS of the DRA driver."""
    starts, prepares = (1, 5) if settings.smoke else (5, 200)
    async with ApiServerStandIn() as api:
        runs = [await _run_once(api, prepares, f"{NODE}-{index}") for index in range(starts)]
    return {
        "to_registration": summary_ms([r["registered"] for r in runs]),
        "to_slice": summary_ms([r["published"] for r in runs]),
        "prepare": latency_ms([s for r in runs for s in r["prepare"]]),
        "unprepare": latency_ms([s for r in runs for s in r["unprepare"]]),
        "rss_start_mib": max(r["rss_start"] for r in runs),
        "rss_after_prepares_mib": max(r["rss_after"] for r in runs),
        "prepares": prepares * starts,
    }
