"""`python -m bench --only fleet`: what a fleet of our DRA drivers costs the real API server, and how fast the real
scheduler places GPU pods on their slices.

For each fleet size N: the real etcd, kube-apiserver, kube-controller-manager and kube-scheduler (the e2e build),
N hollow Nodes (Ready, no kubelet), and N real `DraDriver`s in agent processes (`bench.fleet.agents`), each with
its own connection and identity, 8 simulated BI-V150 boards (16 chips) per node. Then, in order:

1. start: every driver at once; until every node's pool is stored (boards too), and a settle time after;
2. rest: nothing changes for a while (target: no writes at all);
3. scheduling: pods asking for a chip, a board, the extended resource, on the slices of the default ix-config;
   claims: the chip pods' claims prepared on their nodes as the kubelet asks when pods start (one call per pod)
   and unprepared, as when they end: the claims' reads and status writes;
4. rollout: every driver restarted at once with `splitboard: true`, `replicas: 4` (a config change rolled out
   to every node);
5. scheduling: pods asking for a share;
6. scheduling, baseline: the drivers restarted publishing chips alone, pods asking for a chip;
7. XIDs: a critical XID on one chip of 10 % of the nodes;
8. API server restart: SIGTERM (its exit time is measured), started again; the reconnect herd after it.

Then the DRA drivers are stopped and the device plugin's fleet runs on the same nodes (bench.fleet.deviceplugin):
9. dp_start: every device plugin at once (per-node config, Volcano mode, self-healing); until every node's
   Volcano ConfigMap is stored, and a settle time after;
10. dp_rest: nothing changes for a while (target: no requests at all);
11. dp_label_rollout: the node label iluvatar.com/device-plugin.config=replicas set on every node at once;
12. dp_xid: a critical XID on one chip of 10 % of the nodes.

The agents' requests are counted from the API server's audit log (their group only) per phase; the bytes on
the agents' side. etcd's bytes in use are read before and after the start. Results: docs/scale.md explains them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.fleet import scheduling, traffic
from bench.fleet.admin import Admin, add_nodes, chart_objects
from bench.fleet.plane import ControlPlane, control_plane
from bench.settings import Settings
from ix_device_plugin.standins.waits import until

BOARDS = 8  # BI-V150 boards per hollow node: 16 chips
DEVICES = BOARDS * 3  # what one node's pool holds with the default ix-config: 16 chips and 8 boards
NODES_PER_PROCESS = 250
SETTLE = 5.0  # seconds after a phase's last expected write in which a late write would still be counted
POOL_TIMEOUT = 600.0
SHARE_CONFIG = {"splitboard": True, "replicas": 4}  # chips, each shared by up to 4 claims
PLAIN_CONFIG = {"plain": True}
CAPACITY = {"chip": 16, "board": 8, "extended": 8, "share": 64, "plain": 16}  # per node
FILL = 0.75  # at most this share of the fleet's capacity of a shape is asked for


class AgentProcess:
    """One agent host process; `command` sends a command and waits for its answer."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls) -> AgentProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.fleet.agents",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=2**20,
        )
        return cls(process)

    async def command(self, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        await self.process.stdin.drain()
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the agent process exited (code {await self.process.wait()}) on {command['cmd']}")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise RuntimeError(f"agents: {command['cmd']}: {answer['error']}")
        return answer

    async def close(self) -> None:
        if self.process.returncode is None:
            try:
                await self.command(cmd="stop")
                async with asyncio.timeout(30):
                    await self.process.wait()
            except (RuntimeError, TimeoutError, ConnectionError):
                self.process.kill()
                await self.process.wait()


class Fleet:
    """The agent processes of one fleet, addressed together."""

    def __init__(self, processes: list[AgentProcess]) -> None:
        self.processes = processes

    async def each(self, **command: Any) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(process.command(**command) for process in self.processes)))

    async def traffic(self) -> dict[str, int]:
        """The agents' own count of bytes since the last call."""
        counts = await self.each(cmd="counts")
        return {key: sum(count[key] for count in counts) for key in ("bytes_sent", "bytes_received")}

    async def close(self) -> None:
        await asyncio.gather(*(process.close() for process in self.processes))


def node_names(count: int) -> list[str]:
    return [f"hollow-{index:05d}" for index in range(count)]


async def start_fleet(plane: ControlPlane, names: list[str], kind: str = "dra") -> Fleet:
    """The agent processes, NODES_PER_PROCESS nodes each, their agents (DRA drivers, or device plugins with
    kind `deviceplugin`) started at once."""
    groups = math.ceil(len(names) / NODES_PER_PROCESS)
    processes = [await AgentProcess.start() for _ in range(groups)]
    tokens = [str(identity.token_file) for identity in plane.identities]
    specs = [agent_spec(plane, names, tokens, group, kind) for group in range(groups)]
    await asyncio.gather(
        *(process.command(cmd="start", spec=spec) for process, spec in zip(processes, specs, strict=True))
    )
    return Fleet(processes)


def agent_spec(plane: ControlPlane, names: list[str], tokens: list[str], group: int, kind: str) -> dict[str, Any]:
    """The agent spec of one process's share of the nodes."""
    chosen = slice(group * NODES_PER_PROCESS, (group + 1) * NODES_PER_PROCESS)
    return {
        "server": plane.server,
        "ca": str(plane.ca),
        "nodes": names[chosen],
        "token_files": tokens[chosen],
        "boards": BOARDS,
        "config": {},
        "kind": kind,
    }


async def pool_devices(admin: Admin) -> tuple[int, int]:
    """The devices stored in every node's pool, and how many of them are boards."""
    slices = await admin.items("/apis/resource.k8s.io/v1/resourceslices")
    devices = [device for obj in slices for device in obj["spec"].get("devices") or []]
    return len(devices), sum(1 for device in devices if device["name"].startswith("board-"))


async def until_pool(admin: Admin, devices: int, boards: int | None) -> float:
    """Wait until the fleet's pools hold this many devices (and boards, when given); when that was seen."""

    async def complete() -> bool:
        stored, stored_boards = await pool_devices(admin)
        return stored == devices and (boards is None or stored_boards == boards)

    what = f"{devices} devices ({boards} boards) in the pools"
    await until(complete, timeout=POOL_TIMEOUT, interval=0.5, message=what)
    return time.time()


class Phases:
    """Named windows of time; their agent traffic is read from the audit log at the end."""

    def __init__(self) -> None:
        self.windows: dict[str, tuple[float, float]] = {}
        self.bytes: dict[str, dict[str, int]] = {}
        self.extra: dict[str, dict[str, Any]] = {}

    @staticmethod
    async def begin(fleet: Fleet) -> float:
        """A phase starts now: the agents' byte counts zeroed; the time."""
        await fleet.traffic()
        return time.time()

    async def measure(self, name: str, fleet: Fleet, start: float, end: float, **extra: Any) -> None:
        self.windows[name] = (start, end)
        self.bytes[name] = await fleet.traffic()
        self.extra[name] = extra

    def report(self, audit: Path, nodes: int) -> dict[str, Any]:
        requests = traffic.read_audit(audit)
        report = {}
        for name, (start, end) in self.windows.items():
            seen = traffic.window(requests, start, end)
            figures = traffic.summary(seen, nodes, end - start)
            figures["watches_open_at_end"] = traffic.watches_open(requests, end)
            figures |= {f"{key}_per_node": round(value / nodes) for key, value in self.bytes[name].items()}
            report[name] = figures | self.extra[name]
        return report


def settings_logs() -> Path | None:
    """Where the components' logs are kept after a run (IX_FLEET_LOGS), else nowhere."""
    folder = os.environ.get("IX_FLEET_LOGS")
    return Path(folder) if folder else None


async def run_size(settings: Settings, nodes: int) -> dict[str, Any]:
    """Every phase for a fleet of this many nodes."""
    names = node_names(nodes)
    phases = Phases()
    placements: list[dict[str, Any]] = []
    results: dict[str, Any] = {"nodes": nodes}
    with control_plane(nodes, keep=settings_logs()) as plane:
        plane.admin.apply(chart_objects(plane))
        async with Admin(plane) as admin:
            await add_nodes(admin, names)
            await scheduling.prepare_namespace(admin)
            etcd_before = plane.etcd_bytes_in_use()
            started = time.time()
            fleet = await start_fleet(plane, names)
            try:
                pooled = await until_pool(admin, nodes * DEVICES, nodes * BOARDS)
                await asyncio.sleep(SETTLE)
                await phases.measure("start", fleet, started, time.time(), pool_complete_s=round(pooled - started, 2))
                results["etcd_bytes_per_node"] = round((plane.etcd_bytes_in_use() - etcd_before) / nodes)
                slices = await admin.items("/apis/resource.k8s.io/v1/resourceslices")
                results["slice_json_bytes_per_node"] = round(len(json.dumps(slices)) / nodes)
                rest_start = await phases.begin(fleet)
                await asyncio.sleep(settings.fleet_rest_seconds)
                await phases.measure("rest", fleet, rest_start, time.time())
                prepared = functools.partial(_claims, admin, fleet, phases, names)
                placements.append(await _placed(admin, "chip", nodes, settings.fleet_pods, prepared))
                for shape in ("board", "extended"):
                    placements.append(await _placed(admin, shape, nodes, settings.fleet_pods))
                placements.append(await _rollout(admin, fleet, phases, nodes, settings.fleet_pods))
                await fleet.each(cmd="restart", config=PLAIN_CONFIG)
                await until_pool(admin, nodes * BOARDS * 2, 0)
                placements.append(await _placed(admin, "plain", nodes, settings.fleet_pods))
                await xid_phase(fleet, phases, nodes, settings)
                results["apiserver_exit_s"] = await _apiserver_restart(plane, admin, fleet, phases, nodes, settings)
            finally:
                await fleet.close()
            from bench.fleet import deviceplugin  # it builds on this module

            await deviceplugin.run_phases(plane, admin, names, phases, settings)
        results["phases"] = phases.report(plane.audit_log, nodes)
    results["scheduling"] = placements
    return results


async def _placed(
    admin: Admin, shape: str, nodes: int, pods: int, while_bound: Callable[[], Awaitable[None]] | None = None
) -> dict[str, Any]:
    """count pods of shape placed (then while_bound run), and cleaned away; the scheduler's figures."""
    count = min(pods, int(FILL * CAPACITY[shape] * nodes))
    figures = await scheduling.place(admin, shape, count)
    if while_bound is not None:
        await while_bound()
    await scheduling.clean(admin)
    print(f" {nodes} nodes {shape}: {figures['pods_per_second']} pods/s", end="", file=sys.stderr, flush=True)
    return figures


async def _claims(admin: Admin, fleet: Fleet, phases: Phases, names: list[str]) -> None:
    """Every bound claim prepared on its node, one call per pod, then unprepared; the window it takes."""
    pods = await scheduling.claims_by_node(admin)
    index = {name: position for position, name in enumerate(names)}
    groups: dict[int, dict[str, Any]] = {}
    for node, node_pods in pods.items():
        groups.setdefault(index[node] // NODES_PER_PROCESS, {})[node] = node_pods
    started = await phases.begin(fleet)
    answers = {}
    for verb in ("prepare", "unprepare"):
        done = await asyncio.gather(
            *(fleet.processes[group].command(cmd=verb, pods=chosen) for group, chosen in groups.items())
        )
        answers[verb] = done
        if failed := sum(answer["failed"] for answer in done):
            errors = [error for answer in done for error in answer["errors"]]
            raise RuntimeError(f"{verb}: {failed} claims failed, for example: {errors[:3]}")
    claims = sum(answer["claims"] for answer in answers["prepare"])
    seconds = {f"{verb}_s": max(answer["seconds"] for answer in done) for verb, done in answers.items()}
    await phases.measure("claims", fleet, started, time.time() + 1.0, claims=claims, **seconds)


async def _rollout(admin: Admin, fleet: Fleet, phases: Phases, nodes: int, pods: int) -> dict[str, Any]:
    """Every driver restarted with replicas: 4 at once; then pods asking for a share."""
    started = await phases.begin(fleet)
    await fleet.each(cmd="restart", config=SHARE_CONFIG)
    shared = await _until_shared(admin, nodes)
    await asyncio.sleep(SETTLE)
    await phases.measure("rollout", fleet, started, time.time(), pool_complete_s=round(shared - started, 2))
    return await _placed(admin, "share", nodes, pods)


async def _until_shared(admin: Admin, nodes: int) -> float:
    """Wait until every node's pool shares its chips (two shareable devices a board); when that was seen."""

    async def shared() -> bool:
        slices = await admin.items("/apis/resource.k8s.io/v1/resourceslices")
        devices = [device for obj in slices for device in obj["spec"].get("devices") or []]
        return sum(1 for device in devices if device.get("allowMultipleAllocations")) >= nodes * BOARDS * 2

    await until(shared, timeout=POOL_TIMEOUT, interval=0.5, message="the shared chips in every pool")
    return time.time()


async def xid_phase(fleet: Fleet, phases: Phases, nodes: int, settings: Settings, name: str = "xid") -> None:
    """A critical XID on one chip of every tenth node; the window its handling takes, measured as phase name."""
    chosen = list(range(0, nodes, 10))
    started = await phases.begin(fleet)
    by_process: dict[int, list[int]] = {}
    for index in chosen:
        by_process.setdefault(index // NODES_PER_PROCESS, []).append(index % NODES_PER_PROCESS)
    await asyncio.gather(
        *(fleet.processes[group].command(cmd="xid", nodes=indices, xid=79) for group, indices in by_process.items())
    )
    await asyncio.sleep(settings.fleet_rest_seconds)
    await phases.measure(name, fleet, started, time.time(), nodes_with_xid=len(chosen))


async def _apiserver_restart(
    plane: ControlPlane, admin: Admin, fleet: Fleet, phases: Phases, nodes: int, settings: Settings
) -> float:
    """SIGTERM to the API server, started again; the window from the SIGTERM to fleet_rest_seconds after the new
    one is ready (the agents' first requests reach it as soon as it listens, before it says it is ready). Its
    exit time."""
    stopping = await phases.begin(fleet)
    exited = await asyncio.to_thread(plane.stop_apiserver)
    await asyncio.to_thread(plane.start_apiserver)
    await asyncio.sleep(settings.fleet_rest_seconds)
    await phases.measure("apiserver_restart", fleet, stopping, time.time())
    return round(exited, 2)


async def run(settings: Settings) -> dict[str, Any]:
    """The fleet bench for every size of settings.fleet_nodes."""
    sizes = {}
    for nodes in settings.fleet_nodes:
        sizes[str(nodes)] = await run_size(settings, nodes)
    return {"pods": settings.fleet_pods, "rest_seconds": settings.fleet_rest_seconds, "sizes": sizes}
