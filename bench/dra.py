"""DRA mode: start-up (process start -> registration served, -> ResourceSlice published, -> the whole pool with
its board devices), prepare and unprepare latency of chip, board and shared-chip claims, and of a pod whose
container holds two claims made from its templates (the driver reads the pod and has each spec name both chips),
through the kubelet DRA stand-in, the driver's RSS, on 2 BI-V150 boards (4 chips, 2 boards); and the time from an
XID to the kubelet's health update (DRAResourceHealth stream) and to the slice's taint, over the compiled
libixml.so double.

The driver is `ix-device-plugin dra` in its own process, against the API server stand-in.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.plugin import short_dir, stop_process
from bench.procfs import rss_mib
from bench.stats import latency_ms, summary_ms
from ix_device_plugin.dra.pool import slice_base_name
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.dra_kubelet import DraKubeletStandIn
from ix_device_plugin.standins.waits import until

NODE = "bench-node"
START_TIMEOUT = 15.0


SIMULATED = ("--backend", "simulated", "--simulated-devices", "BI-V150:2")


def _command(
    directory: Path, kubeconfig: Path, node: str, *extra: str, backend: tuple[str, ...] = SIMULATED
) -> list[str]:
    return [
        sys.executable, "-m", "ix_device_plugin", "dra", *backend,
        "--node-name", node, "--kubeconfig", str(kubeconfig),
        "--kubelet-registrar-directory-path", str(directory / "registry"),
        "--kubelet-plugins-directory-path", str(directory / "plugins"),
        "--cdi-spec-dir", str(directory / "cdi"), "--dev-root", str(directory),
        "--node-feature-dir", "off", "--telemetry-interval", "off", "--pod-resources-socket", "off",
        "--log-level", "warning", *extra,
    ]  # fmt: skip


async def _wait(predicate: Any, what: str) -> None:
    """Wait until predicate() holds, looking every 2 ms (the latencies measured start from what it sees)."""
    await until(predicate, timeout=START_TIMEOUT, interval=0.002, message=what)


async def _registered(directory: Path) -> DraKubeletStandIn:
    """A kubelet DRA stand-in registered with the driver whose registration socket is under directory."""
    socket = directory / "registry" / f"{DRIVER}-reg.sock"
    await _wait(socket.is_socket, "registration socket")
    kubelet = DraKubeletStandIn(DRIVER)
    await kubelet.register(socket)
    return kubelet


def _claim(
    api: ApiServerStandIn, node: str, device: str, share: bool = False, pod: tuple[str, str] | None = None
) -> tuple[str, str, str]:
    uid, name = str(uuid.uuid4()), f"claim-{uuid.uuid4().hex[:8]}"
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
    if share:
        result.update(shareID=str(uuid.uuid4()), consumedCapacity={"shares": "1"})
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid}
    if pod is not None:  # made from the pod's template: the driver reads the pod to name every chip it holds
        owner = {"apiVersion": "v1", "kind": "Pod", "name": pod[0], "uid": pod[1], "controller": True}
        metadata["ownerReferences"] = [owner]
    api.put("resourceclaims", {"metadata": metadata, "status": {"allocation": {"devices": {"results": [result]}}}})
    return "default", name, uid


def _pod_of_two_claims(api: ApiServerStandIn, node: str) -> list[tuple[str, str, str]]:
    """A pod whose one container holds two claims made from its templates (gpu-0 and gpu-2): the claims."""
    pod = (f"pod-{uuid.uuid4().hex[:8]}", str(uuid.uuid4()))
    claims = [_claim(api, node, device, pod=pod) for device in ("gpu-0", "gpu-2")]
    entries = [{"name": f"c{i}", "resourceClaimTemplateName": "t"} for i in range(2)]
    api.put(
        "pods",
        {
            "metadata": {"name": pod[0], "namespace": "default", "uid": pod[1]},
            "spec": {
                "containers": [{"name": "main", "resources": {"claims": [{"name": "c0"}, {"name": "c1"}]}}],
                "resourceClaims": entries,
            },
            "status": {
                "resourceClaimStatuses": [{"name": f"c{i}", "resourceClaimName": c[1]} for i, c in enumerate(claims)]
            },
        },
    )
    return claims


def _devices(stored: dict[str, Any] | None) -> int:
    return len(((stored or {}).get("spec") or {}).get("devices") or [])


async def _run_once(api: ApiServerStandIn, prepares: int, node: str) -> dict[str, Any]:
    directory = short_dir()
    kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
    name = slice_base_name(node)  # a node per start: each start publishes its slice afresh
    started = time.perf_counter()
    process = subprocess.Popen(_command(directory, kubeconfig, node), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        kubelet = await _registered(directory)
        registered = time.perf_counter() - started
        await _wait(lambda: api.get("resourceslices", name) is not None, "ResourceSlice")
        published = time.perf_counter() - started
        await _wait(lambda: _devices(api.get("resourceslices", name)) == 6, "the board devices")
        whole_pool = time.perf_counter() - started
        rss_start = rss_mib(process.pid)
        prepare, prepare_board, unprepare = [], [], []
        for index in range(prepares):
            board = index % 2 == 1
            claim = _claim(api, node, f"board-{2 * (index % 4 // 2)}" if board else f"gpu-{index % 4}")
            begin = time.perf_counter()
            response = await kubelet.prepare([claim])
            (prepare_board if board else prepare).append(time.perf_counter() - begin)
            assert response.claims[claim[2]].error == "", response.claims[claim[2]].error
            begin = time.perf_counter()
            await kubelet.unprepare([claim])
            unprepare.append(time.perf_counter() - begin)
        pods = []
        for _ in range(prepares // 2):
            claims = _pod_of_two_claims(api, node)
            begin = time.perf_counter()
            response = await kubelet.prepare(claims)
            pods.append(time.perf_counter() - begin)
            assert all(response.claims[c[2]].error == "" for c in claims), response
            await kubelet.unprepare(claims)
        rss_after = rss_mib(process.pid)
        await kubelet.close()
        return {
            "registered": registered,
            "published": published,
            "whole_pool": whole_pool,
            "prepare": prepare,
            "prepare_board": prepare_board,
            "prepare_pod_of_two_claims": pods,
            "unprepare": unprepare,
            "rss_start": rss_start,
            "rss_after": rss_after,
        }
    finally:
        await stop_process(process)
        shutil.rmtree(directory, ignore_errors=True)


async def _shares(api: ApiServerStandIn, rounds: int, node: str) -> list[float]:
    """Seconds to prepare one share claim, four at a time on one chip (sharing.timeSlicing.replicas 4)."""
    directory = short_dir()
    kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
    command = _command(directory, kubeconfig, node, "--replicas", "4", "--splitboard", "true")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds: list[float] = []
    try:
        kubelet = await _registered(directory)
        await _wait(lambda: _devices(api.get("resourceslices", slice_base_name(node))) == 4, "the shared chips")

        async def one(claim: tuple[str, str, str]) -> None:
            begin = time.perf_counter()
            response = await kubelet.prepare([claim])
            seconds.append(time.perf_counter() - begin)
            assert response.claims[claim[2]].error == "", response.claims[claim[2]].error

        for _ in range(rounds):
            claims = [_claim(api, node, "gpu-0", share=True) for _ in range(4)]
            await asyncio.gather(*(one(claim) for claim in claims))
            await kubelet.unprepare(claims)
        await kubelet.close()
    finally:
        await stop_process(process)
        shutil.rmtree(directory, ignore_errors=True)
    return seconds


DOUBLE_SOURCE = Path(__file__).resolve().parents[1] / "tests" / "ixml_double" / "libixml_double.c"


def _double(directory: Path, chips: int = 4, uuid_prefix: str = "GPU-x") -> Path | None:
    """The libixml.so double compiled into directory, chips BI-V100 chips in its device file and /dev nodes; None
    without a C compiler."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return None
    library = directory / "libixml.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(DOUBLE_SOURCE)], check=True)
    (directory / "dev").mkdir(exist_ok=True)
    lines = ["driver=4.1.0"]
    for minor in range(chips):
        (directory / "dev" / f"iluvatar{minor}").touch()
        lines.append(f'device uuid={uuid_prefix}{minor} name="Iluvatar BI-V100" minor={minor}')
    (directory / "double.conf").write_text("\n".join(lines) + "\n")
    return library


def _over_double(library: Path) -> tuple[str, ...]:
    """The driver's backend arguments for the libixml.so double at library."""
    return ("--backend", "ixml", "--ixml-library", str(library))


async def _xid_to_health(api: ApiServerStandIn, node: str, xids: int) -> dict[str, list[float]] | None:
    """Seconds from writing an XID into the double's file to the kubelet's stream saying UNHEALTHY, and to the
    slice's taint; one XID per chip."""
    directory = short_dir()
    library = _double(directory)
    if library is None:
        return None
    kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
    command = _command(directory, kubeconfig, node, backend=_over_double(library))
    env = {**os.environ, "IXML_DOUBLE_CONFIG": str(directory / "double.conf")}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    stream, taint = [], []
    try:
        kubelet = await _registered(directory)
        watch = await kubelet.watch_health("v1")
        await watch.wait_for(lambda w: len(w.devices) == 4, timeout=START_TIMEOUT)
        name = slice_base_name(node)
        for minor in range(min(xids, 4)):
            device = f"gpu-{minor}"
            began = time.perf_counter()
            with (directory / "double.conf").open("a") as conf:
                conf.write(f"xid={minor},79\n")
            await watch.wait_for(lambda w, d=device: w.devices[d][0] == "UNHEALTHY", timeout=START_TIMEOUT)
            stream.append(time.perf_counter() - began)
            await _wait(lambda d=device: _tainted(api.get("resourceslices", name), d), "taint")
            taint.append(time.perf_counter() - began)
        await watch.close()
        await kubelet.close()
    finally:
        await stop_process(process)
        shutil.rmtree(directory, ignore_errors=True)
    return {"stream": stream, "taint": taint}


def _tainted(stored: dict[str, Any] | None, device: str) -> bool:
    devices = {d["name"]: d for d in ((stored or {}).get("spec") or {}).get("devices") or []}
    return bool(devices.get(device, {}).get("taints"))


async def run(settings: Any) -> dict[str, Any]:
    """Start-ups, prepare/unprepare round trips and RSS of the DRA driver."""
    starts, prepares = (1, 5) if settings.smoke else (5, 200)
    async with ApiServerStandIn() as api:
        runs = [await _run_once(api, prepares, f"{NODE}-{index}") for index in range(starts)]
        shares = await _shares(api, 2 if settings.smoke else 50, f"{NODE}-shares")
        health = await _xid_to_health(api, f"{NODE}-xid", 1 if settings.smoke else 4)
    xid = {} if health is None else {
        "xid_to_kubelet_health": latency_ms(health["stream"]),
        "xid_to_slice_taint": latency_ms(health["taint"]),
    }  # fmt: skip
    return {
        **xid,
        "to_registration": summary_ms([r["registered"] for r in runs]),
        "to_slice": summary_ms([r["published"] for r in runs]),
        "to_whole_pool": summary_ms([r["whole_pool"] for r in runs]),
        "prepare": latency_ms([s for r in runs for s in r["prepare"]]),
        "prepare_board": latency_ms([s for r in runs for s in r["prepare_board"]]),
        "prepare_pod_of_two_claims": latency_ms([s for r in runs for s in r["prepare_pod_of_two_claims"]]),
        "prepare_share_4_at_once": latency_ms(shares),
        "unprepare": latency_ms([s for r in runs for s in r["unprepare"]]),
        "rss_start_mib": max(r["rss_start"] for r in runs),
        "rss_after_prepares_mib": max(r["rss_after"] for r in runs),
        "prepares": prepares * starts,
    }
