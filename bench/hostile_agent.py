"""The agent against an API server that means harm: its peak resident memory, how long it takes to refuse, and
how long SIGTERM takes.

The plugin process runs on one simulated GPU with per-node config, GPU reset, Volcano mode and telemetry on,
against the API server stand-in. Once its start-up work is done, every answer becomes one without end (lists
and objects stream on, watch events never end): the watches read again and again, each read refused at its
cap, for the window; an Allocate asks for a GPU reset, whose handshake reads an answer without end. Then the
plugin's peak resident memory (VmHWM) is read and it is sent SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from typing import Any

import grpc

from bench import procfs
from bench.api_features import NAMESPACE, NODE, READY_TIMEOUT
from bench.plugin import ONE_GPU, RESOURCE, PluginProcess, short_dir, stop_process
from bench.settings import Settings
from ix_device_plugin.deviceplugin.features.volcano import DEV_VOLCANO, PREDICATE_TIME
from ix_device_plugin.hardware.simulated import default_uuid
from ix_device_plugin.standins.apiserver import ApiServerStandIn, bodies
from ix_device_plugin.standins.apiserver.managedfields import Writer
from ix_device_plugin.standins.waits import WaitFailed, until

SCHEDULER = Writer("vc-scheduler", "v1")  # the annotations as Volcano's scheduler writes them
FEATURES = ("--per-node-config", "true", "--reset-gpu", "true", "--use-volcano", "true", "--telemetry-interval", "1")


async def run(settings: Settings) -> dict[str, Any]:
    """The plugin's peak RSS (MiB) under answers without end, the Allocate refusal (ms), and its stop (s)."""
    workdir = short_dir()
    try:
        async with ApiServerStandIn() as api:
            api.add_node(NODE)
            kubeconfig = api.write_kubeconfig(workdir / "kubeconfig", namespace=NAMESPACE)
            env = {"NODE_NAME": NODE, "POD_NAMESPACE": NAMESPACE, "KUBECONFIG": str(kubeconfig)}
            # Volcano placed a pod on the GPU: an Allocate finds it in the view read at start (the ConfigMap is
            # written only once that view is read), then asks for a reset.
            annotations = {DEV_VOLCANO: default_uuid(0, 0), PREDICATE_TIME: "100"}
            limits = {"main": {RESOURCE: "1"}}
            api.add_pod("bench", "placed", NODE, phase="Pending", limits=limits)
            api.patch("pods", "placed", "bench", {"metadata": {"annotations": annotations}}, SCHEDULER)
            async with PluginProcess(ONE_GPU, extra_args=FEATURES, extra_env=env) as plugin:
                await plugin.launch()
                config_map = f"ix-device-info-cm-{NODE}"
                await plugin.waits_for(
                    lambda: api.get("configmaps", config_map, NAMESPACE) is not None, "its ConfigMap", READY_TIMEOUT
                )
                await asyncio.sleep(settings.settle_seconds)
                at_rest = procfs.rss_mib(plugin.pid)
                api.bodies = bodies.ENDLESS
                api.drop_watches()
                refused_ms = await _allocate_refused(plugin)
                api.bodies = bodies.ENDLESS_EVENT  # watches too: the reads between them stay endless lists
                api.drop_watches()
                await asyncio.sleep(1.0 if settings.smoke else 10.0)
                reads = sum(1 for request in api.requests if request.method == "GET")
                peak = procfs.peak_rss_mib(plugin.pid)
                assert plugin.process is not None
                process, plugin.process = plugin.process, None
                started = time.monotonic()
                process.terminate()
                with contextlib.suppress(WaitFailed):  # not stopped within 10 s: that is the figure, then it is killed
                    await until(lambda: process.poll() is not None, timeout=10, interval=0.01)
                stopped_s = time.monotonic() - started
                await stop_process(process)
                return {
                    "rss_at_rest_mib": at_rest,
                    "peak_rss_mib": peak,
                    "allocate_refused_ms": round(refused_ms, 1),
                    "api_reads": reads,
                    "stop_s": round(stopped_s, 3),
                }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _allocate_refused(plugin: PluginProcess) -> float:
    """How long an Allocate whose reset handshake reads an answer without end takes to be refused (ms)."""
    started = time.perf_counter()
    try:
        await plugin.kubelet.allocate(RESOURCE, [[default_uuid(0, 0)]])
    except grpc.aio.AioRpcError as error:
        if "over the 4 MiB allowed" not in (error.details() or ""):
            raise RuntimeError(f"the Allocate was refused for another reason: {error.details()}") from None
        return (time.perf_counter() - started) * 1000
    raise RuntimeError("an Allocate whose reset handshake could not read the ConfigMap was answered OK")
