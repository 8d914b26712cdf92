"""The fleet bench's device-plugin phases: N real device plugin `Daemon`s (bench.fleet.agents, kind
`deviceplugin`) on the same hollow Nodes, after the DRA drivers are stopped, with the API features a fleet pays
for: per-node config (a watch of the Node's label), Volcano mode (the ConfigMap ix-device-info-cm-<node> kept
current, a watch of it and of the node's pods), self-healing (the GPU reset record, Node Events).

1. dp_start: every plugin at once; until every node's Volcano ConfigMap is stored, and a settle time after;
2. dp_rest: nothing changes for a while (target: no requests at all);
3. dp_label_rollout: the node label iluvatar.com/device-plugin.config=replicas set on every node at once (the key
   `replicas`: 4 time-slicing replicas per GPU); until every node's ConfigMap lists the replicas;
4. dp_xid: a critical XID on one chip of 10 % of the nodes (self-healing, the ConfigMap's free devices).

The phases are measured as the DRA ones are (`Phases`), under their dp_ names.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from bench.fleet import SETTLE, Fleet, Phases, start_fleet, xid_phase
from bench.fleet.admin import Admin, bounded_all, device_plugin_objects
from bench.fleet.agents import DEVICE_PLUGIN, NAMESPACE
from bench.fleet.plane import ControlPlane
from bench.settings import Settings
from ix_device_plugin.standins.waits import until

CONFIG_MAP_PREFIX = "ix-device-info-cm-"
DEVICE_LIST_KEY = "DeviceListCfg"
CONFIG_LABEL = "iluvatar.com/device-plugin.config"
REPLICA_SEPARATOR = "::"
WAIT_TIMEOUT = 600.0


async def run_phases(plane: ControlPlane, admin: Admin, names: list[str], phases: Phases, settings: Settings) -> None:
    """The device-plugin fleet's phases on these (hollow, DRA-free by now) nodes, measured into phases."""
    await asyncio.to_thread(plane.admin.apply, device_plugin_objects(plane))
    started = time.time()
    fleet = await start_fleet(plane, names, DEVICE_PLUGIN)
    try:
        stored = await until_config_maps(admin, names, lambda _data: True)
        await asyncio.sleep(SETTLE)
        await phases.measure("dp_start", fleet, started, time.time(), config_maps_complete_s=round(stored - started, 2))
        rest = await phases.begin(fleet)
        await asyncio.sleep(settings.fleet_rest_seconds)
        await phases.measure("dp_rest", fleet, rest, time.time())
        await _label_rollout(admin, fleet, phases, names)
        await xid_phase(fleet, phases, len(names), settings, "dp_xid")
    finally:
        await fleet.close()


def replicas_listed(data: dict[str, str]) -> bool:
    """True when a Volcano ConfigMap's free devices are time-slicing replicas (`<uuid>::<i>`)."""
    try:
        listed = json.loads(data.get(DEVICE_LIST_KEY, "")).get("DeviceList") or []
    except (ValueError, AttributeError):
        return False
    return bool(listed) and all(REPLICA_SEPARATOR in device for device in listed)


async def until_config_maps(admin: Admin, names: list[str], ready: Callable[[dict[str, str]], bool]) -> float:
    """Wait until every node's Volcano ConfigMap exists and ready(its data) holds; when that was seen."""
    wanted = {CONFIG_MAP_PREFIX + name for name in names}

    async def all_ready() -> bool:
        maps = await admin.items(f"/api/v1/namespaces/{NAMESPACE}/configmaps")
        return wanted <= {m["metadata"]["name"] for m in maps if ready(m.get("data") or {})}

    await until(all_ready, timeout=WAIT_TIMEOUT, interval=0.5, message="every node's Volcano ConfigMap")
    return time.time()


async def _label_rollout(admin: Admin, fleet: Fleet, phases: Phases, names: list[str]) -> None:
    """The node label naming the key `replicas` set on every node at once; until every ConfigMap lists replicas."""
    started = await phases.begin(fleet)
    body = {"metadata": {"labels": {CONFIG_LABEL: "replicas"}}}
    await bounded_all([lambda name=name: admin.request("PATCH", f"/api/v1/nodes/{name}", body) for name in names])
    listed = await until_config_maps(admin, names, replicas_listed)
    await asyncio.sleep(SETTLE)
    complete = round(listed - started, 2)
    await phases.measure("dp_label_rollout", fleet, started, time.time(), config_maps_complete_s=complete)
