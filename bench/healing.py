"""Self-healing: from "chip free" to "chip back in service", and the API writes each health event costs.

The plugin runs as its own process over the compiled libixml.so double (two BI-V100 chips), with the
pod-resources stand-in saying which container holds which device, a fake ixsmi, and the API server stand-in
for the reset handshake and the Node Events. Each run: a pod holds the first chip, an XID arrives (the chip
goes Unhealthy and waits), then the pod goes (the moment measured from; at points spread over the healer's
look cycle, FREE_POLL: the kubelet tells a device plugin nothing when a pod goes) and the chip is reset and
served Healthy on ListAndWatch (the moment measured to). Every request to the stand-in is counted: Event writes
(creates and patches) and the handshake's ConfigMap writes per healing episode.

Storm: one XID reported many times over on a chip a pod holds (it waits: nothing is reset meanwhile); the
Event writes it causes, until the Event's count says every one of them.

DRA: the driver as its own process over the double (four chips) with the kubelet DRA stand-in; each run a
claim holds gpu-0, an XID taints it, the claim is unprepared (the moment measured from: the kubelet's call
answered) and the chip is reset and its taint gone from the stored ResourceSlice (the moment measured to).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import dra
from bench.plugin import RESOURCE, Node, PluginProcess, short_dir, stop_process, track
from bench.settings import Settings
from bench.stats import summary_ms
from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.dra.pool import slice_base_name
from ix_device_plugin.healing.settings import FREE_POLL
from ix_device_plugin.standins.apiserver import ApiServerStandIn, Recorded
from ix_device_plugin.standins.podresources import PodResourcesStandIn

NODE = "bench-node"
NAMESPACE = "kube-system"
CHIPS = Node("2 x BI-V100 (the libixml.so double)", "BI-V100", 2)
TIMEOUT = 30.0
XID = 48  # double-bit ECC: a reset clears it
STORM_XID = 94


def _is_event_write(request: Recorded) -> bool:
    return "/events" in request.path and request.method in ("POST", "PATCH")


def _is_handshake_write(request: Recorded) -> bool:
    return "/configmaps" in request.path and request.method in ("POST", "PUT", "PATCH")


def _health_is(plugin: PluginProcess, device: str, health: str) -> bool:
    view = plugin.kubelet.resources.get(RESOURCE)
    return view is not None and view.devices.get(device) == health


class _Node:
    """The plugin over the double, with the stand-ins it talks to."""

    def __init__(self, plugin: PluginProcess, api: ApiServerStandIn, pods: PodResourcesStandIn, conf: Path) -> None:
        self.plugin, self.api, self.pods, self.conf = plugin, api, pods, conf

    def xid(self, minor: int, xid: int, times: int = 1) -> None:
        with self.conf.open("a") as stream:
            stream.write(f"xid={minor},{xid}\n" * times)

    def held(self, device: str) -> None:
        self.pods.pods = {("bench", "trainer-0"): {"main": {RESOURCE: [device]}}}

    def writes(self, kind: Any) -> int:
        return sum(1 for request in self.api.requests if kind(request))

    def xid_event_count(self) -> int:
        events = [e for e in self.api.objects("events") if e["reason"] == "GPUXidError" and "GPU 1 " in e["message"]]
        return sum(int(e.get("count", 0)) for e in events)

    async def episode(self, phase: float) -> float:
        """One healing: seconds from the pod's going (phase of the healer's look cycle after a look) to the chip
        Healthy on ListAndWatch."""
        plugin = self.plugin
        self.held("GPU-h0")
        self.xid(0, XID)
        await plugin.waits_for(lambda: _health_is(plugin, "GPU-h0", UNHEALTHY), "Unhealthy", TIMEOUT, 0.005)
        looked = self.pods.calls
        await plugin.waits_for(
            lambda: self.pods.calls >= looked + 2, "looks at pod-resources", TIMEOUT, 0.005
        )  # it waits, held
        await asyncio.sleep(phase * FREE_POLL)
        self.pods.pods = {}
        freed = time.perf_counter()
        await plugin.waits_for(lambda: _health_is(plugin, "GPU-h0", HEALTHY), "Healthy again", TIMEOUT, 0.005)
        return time.perf_counter() - freed

    async def storm(self, count: int) -> dict[str, Any]:
        """count identical XIDs on a held chip: the Event writes until the Event counts them all."""
        self.held("GPU-h1")
        before = self.writes(_is_event_write)
        began = time.perf_counter()
        self.xid(1, STORM_XID, count)
        await self.plugin.waits_for(
            lambda: self.xid_event_count() >= count, f"an Event counting {count} XIDs", 60, 0.005
        )
        return {
            "xids": count,
            "event_writes": self.writes(_is_event_write) - before,
            "seconds": round(time.perf_counter() - began, 3),
        }


async def run(settings: Settings) -> dict[str, Any]:
    """Free -> back in service over settings.healing_runs episodes, and the API writes of each and of a storm."""
    directory = short_dir()
    try:
        library = dra._double(directory, chips=2, uuid_prefix="GPU-h")
        if library is None:
            return {"skipped_no_c_compiler": 1}
        ixsmi = directory / "ixsmi"
        ixsmi.write_text("#!/bin/sh\nexit 0\n")
        ixsmi.chmod(0o755)
        async with ApiServerStandIn() as api:
            api.add_node(NODE)
            pods = PodResourcesStandIn(directory / "pod-resources.sock")
            await pods.start()
            try:
                measured = await _measure(settings, directory, library, ixsmi, api, pods)
            finally:
                await pods.stop()
            dra_samples = await _dra_episodes(api, settings.healing_runs, ixsmi)
        return {**measured, "dra_free_to_untainted": summary_ms(dra_samples)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _measure(
    settings: Settings,
    directory: Path,
    library: Path,
    ixsmi: Path,
    api: ApiServerStandIn,
    pods: PodResourcesStandIn,
) -> dict[str, Any]:
    kubeconfig = api.write_kubeconfig(directory / "kubeconfig", namespace=NAMESPACE)
    env = {
        "NODE_NAME": NODE,
        "POD_NAMESPACE": NAMESPACE,
        "KUBECONFIG": str(kubeconfig),
        "IXML_DOUBLE_CONFIG": str(directory / "double.conf"),
    }
    sysfs = directory / "sys"  # a node with Iluvatar's driver: the directory ixsmi -r writes
    (sysfs / "bus" / "pci" / "drivers" / "iluvatar").mkdir(parents=True, exist_ok=True)
    args = ("--backend", "ixml", "--ixml-library", str(library), "--ixsmi-path", str(ixsmi), "--sysfs-root", str(sysfs))
    args += ("--pod-resources-socket", str(pods.socket_path), "--health-interval", str(settings.health_interval))
    async with PluginProcess(CHIPS, extra_args=args, extra_env=env) as plugin:
        (plugin.workdir / "dev").mkdir(exist_ok=True)
        for minor in range(2):
            (plugin.workdir / "dev" / f"iluvatar{minor}").touch()
        node = _Node(plugin, api, pods, directory / "double.conf")
        await plugin.launch()
        events, handshake = node.writes(_is_event_write), node.writes(_is_handshake_write)
        phases = [index / settings.healing_runs for index in range(settings.healing_runs)]
        random.Random(7).shuffle(phases)  # pods go at spread-out points of the look cycle
        samples = [await node.episode(phase) for phase in phases]
        events = node.writes(_is_event_write) - events
        handshake = node.writes(_is_handshake_write) - handshake
        storm = await node.storm(settings.healing_storm)
    return {
        "runs": settings.healing_runs,
        "free_to_in_service": summary_ms(samples),
        "event_writes_per_episode": round(events / settings.healing_runs, 2),
        "handshake_writes_per_episode": round(handshake / settings.healing_runs, 2),
        "storm": {**storm, "writes_per_xid": round(storm["event_writes"] / storm["xids"], 4)},
    }


def _tainted(api: ApiServerStandIn, node: str, device: str) -> bool:
    return dra._tainted(api.get("resourceslices", slice_base_name(node)), device)


async def _dra_episodes(api: ApiServerStandIn, runs: int, ixsmi: Path) -> list[float]:
    """Seconds from unpreparing the claim on a chip with an XID to its taint gone from the stored slice."""
    node = f"{NODE}-dra"
    directory = short_dir()
    library = dra._double(directory)
    assert library is not None  # a compiler was there for the device plugin's runs
    kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
    sysfs = directory / "sys"  # a node with Iluvatar's driver: the directory ixsmi -r writes
    (sysfs / "bus" / "pci" / "drivers" / "iluvatar").mkdir(parents=True, exist_ok=True)
    reset = ("--ixsmi-path", str(ixsmi), "--sysfs-root", str(sysfs))
    command = dra._command(directory, kubeconfig, node, *reset, backend=dra._over_double(library))
    env = {**os.environ, "IXML_DOUBLE_CONFIG": str(directory / "double.conf")}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    track(process)
    samples = []
    try:
        kubelet = await dra._registered(directory)
        await dra._wait(lambda: dra._devices(api.get("resourceslices", slice_base_name(node))) == 4, "the slice")
        for _ in range(runs):
            claim = dra._claim(api, node, "gpu-0")
            assert (await kubelet.prepare([claim])).claims[claim[2]].error == ""
            with (directory / "double.conf").open("a") as conf:
                conf.write(f"xid=0,{XID}\n")
            await dra._wait(lambda: _tainted(api, node, "gpu-0"), "the taint")
            await kubelet.unprepare([claim])
            freed = time.perf_counter()
            await dra._wait(lambda: not _tainted(api, node, "gpu-0"), "the taint gone")
            samples.append(time.perf_counter() - freed)
        await kubelet.close()
    finally:
        await stop_process(process)
        shutil.rmtree(directory, ignore_errors=True)
    return samples
