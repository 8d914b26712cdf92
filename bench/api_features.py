"""What the API features cost a node: resident memory with them off and on, and the requests each makes at idle.

Memory: the plugin on one simulated GPU with per-node config, GPU reset and Volcano mode off, next to the same
node with per-node config and Volcano mode on against the API server stand-in (the client library is
imported only then).

Idle load: the plugin with one feature on (per-node config, GPU reset, Volcano mode), once its start-up work
is done (node label watched, reset handshake announced, device-info ConfigMap written), over a measured window
in which nothing changes. Every request the stand-in receives in the window is counted: a watch being opened
(again) apart, since a watch open at idle is the price of hearing about a change; everything else is load
that buys nothing. Both are given per node per hour; the target for the rest is zero.

Hostile watches: the plugin with per-node config against an API server that answers every watch with 410
Expired (as after a compaction), or ends every watch at once: the requests per second one node makes over
the same window, from the moment the watches start to end so (its backoff growing from 0.5 s to 30 s).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import procfs
from bench.plugin import ONE_GPU, PluginProcess, short_dir
from bench.settings import Settings
from ix_device_plugin.standins.apiserver import ApiServerStandIn, Recorded

NODE = "bench-node"
NAMESPACE = "kube-system"
CONNECTED_SECONDS = 3.0  # long enough for the node label watch and a Volcano pass
READY_TIMEOUT = 20.0
HOUR = 3600.0

FEATURES: dict[str, tuple[str, ...]] = {
    "per_node_config": ("--per-node-config", "true"),
    "gpu_reset": ("--reset-gpu", "true"),
    "volcano": ("--use-volcano", "true"),
}


def _watching(api: ApiServerStandIn) -> bool:
    return any(_is_watch(request) for request in api.requests)


def _announced(api: ApiServerStandIn) -> bool:
    return api.get("configmaps", f"ix-gpu-reset-{NODE}", NAMESPACE) is not None


def _published(api: ApiServerStandIn) -> bool:
    return api.get("configmaps", f"ix-device-info-cm-{NODE}", NAMESPACE) is not None


READY: dict[str, Callable[[ApiServerStandIn], bool]] = {
    "per_node_config": _watching,
    "gpu_reset": _announced,
    "volcano": _published,
}


def _is_watch(request: Recorded) -> bool:
    return request.query.get("watch") in ("true", "1")


def _env(api: ApiServerStandIn, workdir: Path) -> dict[str, str]:
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig", namespace=NAMESPACE)
    return {"NODE_NAME": NODE, "POD_NAMESPACE": NAMESPACE, "KUBECONFIG": str(kubeconfig)}


async def _rss(settings: Settings, args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> dict[str, Any]:
    async with PluginProcess(ONE_GPU, extra_args=args, extra_env=env) as plugin:
        await plugin.launch()
        await asyncio.sleep(settings.settle_seconds + (CONNECTED_SECONDS if args else 0))
        return {"rss_mib": procfs.rss_mib(plugin.pid), "threads": procfs.threads(plugin.pid)}


async def _window(settings: Settings, feature: str, watches_end: str | None = None) -> tuple[float, list[Recorded]]:
    """The requests the plugin with `feature` on makes over the idle window, once started (and the window)."""
    workdir = short_dir()
    try:
        async with ApiServerStandIn() as api:
            api.add_node(NODE)
            async with PluginProcess(ONE_GPU, extra_args=FEATURES[feature], extra_env=_env(api, workdir)) as plugin:
                await plugin.launch()
                await plugin.waits_for(lambda: READY[feature](api), f"{feature}'s start-up work", READY_TIMEOUT)
                await asyncio.sleep(settings.settle_seconds)
                if watches_end is not None:  # the open watches end too: from now on every one ends so
                    api.watches_end = watches_end
                    api.drop_watches()
                first, started = len(api.requests), time.monotonic()
                await asyncio.sleep(settings.idle_seconds)
                return time.monotonic() - started, api.requests[first:]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def idle_requests(settings: Settings, feature: str) -> dict[str, float]:
    """Requests per hour the plugin makes with `feature` on while nothing changes: watches opened, and the rest."""
    window, seen = await _window(settings, feature)
    watches = sum(_is_watch(request) for request in seen)
    return {
        "requests_per_hour": round((len(seen) - watches) * HOUR / window, 1),
        "watch_opens_per_hour": round(watches * HOUR / window, 1),
        "window_s": round(window, 1),
    }


async def run(settings: Settings) -> dict[str, Any]:
    """RSS with every API feature off and with per-node config and Volcano mode on; each feature's idle requests."""
    off = await _rss(settings)
    workdir = short_dir()
    try:
        async with ApiServerStandIn() as api:
            api.add_node(NODE)
            on = await _rss(settings, (*FEATURES["per_node_config"], *FEATURES["volcano"]), _env(api, workdir))
            if not _published(api):
                raise RuntimeError("Volcano mode did not publish its ConfigMap: the API features were not on")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    # Each window has its own API server and plugin process: they run side by side.
    endings = (("expired", "expired"), ("ended_at_once", "at once"))
    measured = await asyncio.gather(
        *(idle_requests(settings, feature) for feature in FEATURES),
        *(_window(settings, "per_node_config", ending) for _, ending in endings),
    )
    idle = dict(zip(FEATURES, measured[: len(FEATURES)], strict=True))
    hostile = {
        name: {"requests_per_s": round(len(seen) / window, 2), "window_s": round(window, 1)}
        for (name, _), (window, seen) in zip(endings, measured[len(FEATURES) :], strict=True)
    }
    return {
        "off": off,
        "on": on,
        "rss_added_mib": round(on["rss_mib"] - off["rss_mib"], 2),
        "idle": idle,
        "hostile_watches": hostile,
    }
