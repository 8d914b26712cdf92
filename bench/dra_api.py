"""What the DRA driver asks of the API server per node: at start, at idle, and when its Node is re-created.

The driver is `ix-device-plugin dra` in its own process (2 simulated BI-V150 boards) against the API server
stand-in, whose garbage collector model deletes a slice whose owner is gone.

- Start: every request from the process start until the whole pool (boards too) is stored, by verb (a
  server-side dry run counted apart: it writes nothing), and the slice writes among them.
- Idle: once settled, over the idle window: requests per hour (target zero) and watches opened per hour
  (the slices' and the Node's watches; a watch open at idle is the price of hearing about a change).
- Node re-created: the Node deleted and added again (a new UID): the slice writes until the slices are owned
  by the new Node, and the slice writes per minute over the idle window after that (a create-and-delete loop
  with the garbage collector would show here; the target is zero).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections import Counter
from typing import Any

from bench.dra import _command
from bench.plugin import short_dir, stop_process
from bench.settings import Settings
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.standins.apiserver import ApiServerStandIn, Recorded
from ix_device_plugin.standins.dra_kubelet import DraKubeletStandIn
from ix_device_plugin.standins.waits import until

NODE = "bench-api-node"
TIMEOUT = 20.0
HOUR, MINUTE = 3600.0, 60.0


def _is_watch(request: Recorded) -> bool:
    return request.query.get("watch") in ("true", "1")


def _is_slice_write(request: Recorded) -> bool:
    return "/resourceslices" in request.path and request.method in ("POST", "PUT", "DELETE", "PATCH")


def _devices(api: ApiServerStandIn) -> int:
    return sum(len(s["spec"].get("devices") or []) for s in api.objects("resourceslices"))


def _owners(api: ApiServerStandIn) -> set[str]:
    return {o["uid"] for s in api.objects("resourceslices") for o in s["metadata"].get("ownerReferences") or []}


def _verb(request: Recorded) -> str:
    if _is_watch(request):
        return "WATCH"
    return "DRY RUN" if request.query.get("dryRun") == "All" else request.method


def _by_verb(requests: list[Recorded]) -> dict[str, int]:
    counted = Counter(_verb(r) for r in requests)
    return dict(sorted(counted.items()))


async def run(settings: Settings) -> dict[str, Any]:
    """Requests at start, at idle, and around a Node re-creation, for one node."""
    directory = short_dir()
    async with ApiServerStandIn() as api:
        api.add_node(NODE)
        kubeconfig = api.write_kubeconfig(directory / "kubeconfig")
        socket = directory / "registry" / f"{DRIVER}-reg.sock"
        process = subprocess.Popen(
            _command(directory, kubeconfig, NODE), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            kubelet = DraKubeletStandIn(DRIVER)
            await until(socket.is_socket, TIMEOUT, 0.01, "the registration socket")
            await kubelet.register(socket)
            await until(lambda: _devices(api) == 6, TIMEOUT, 0.01, "the whole pool")
            start = _by_verb(api.requests)
            start_writes = sum(_is_slice_write(r) and r.query.get("dryRun") != "All" for r in api.requests)
            await asyncio.sleep(settings.settle_seconds)
            first, began = len(api.requests), time.monotonic()
            await asyncio.sleep(settings.idle_seconds)
            idle, window = api.requests[first:], time.monotonic() - began
            watches = sum(_is_watch(r) for r in idle)
            api.delete("nodes", NODE)
            uid = api.add_node(NODE)["metadata"]["uid"]
            first = len(api.requests)
            await until(lambda: _owners(api) == {uid} and _devices(api) == 6, TIMEOUT, 0.01, "the new Node's slices")
            await asyncio.sleep(settings.settle_seconds)
            to_follow = sum(_is_slice_write(r) for r in api.requests[first:])
            first, began = len(api.requests), time.monotonic()
            await asyncio.sleep(settings.idle_seconds)
            after = sum(_is_slice_write(r) for r in api.requests[first:])
            after_window = time.monotonic() - began
            await kubelet.close()
        finally:
            await stop_process(process)
            shutil.rmtree(directory, ignore_errors=True)
    return {
        "start_requests": start,
        "start_slice_writes": start_writes,
        "idle": {
            "requests_per_hour": round((len(idle) - watches) * HOUR / window, 1),
            "watch_opens_per_hour": round(watches * HOUR / window, 1),
            "window_s": round(window, 1),
        },
        "node_recreated": {
            "slice_writes_to_follow": to_follow,
            "slice_writes_per_minute_after": round(after * MINUTE / after_window, 1),
            "window_s": round(after_window, 1),
        },
    }
