"""Many hollow nodes' agents in one process: `python -m bench.fleet.agents`, driven by JSON lines on stdin.

Each hollow node runs one real agent with its own API connection and bearer token, on simulated BI-V150 boards
from its own devices file:
- kind `dra` (the default): the `DraDriver` (its hardware monitor, its checkpoint and CDI directory, its slice
  publisher, its watches of the node's slices and of the Node, claim status, the reset record, self-healing);
- kind `deviceplugin`: the device plugin's `Daemon` with per-node config (the node label
  iluvatar.com/device-plugin.config picks `default` or `replicas` from the node's config directory, both with
  Volcano mode on: the ConfigMap ix-device-info-cm-<node> and a watch of the node's pods), self-healing and
  its Events. Its gRPC server listens on a socket in the node's directory; it never registers with a kubelet.
Only the kubelet side is left out: no kubelet registration, no probe port (the kubelet's calls are not API
server traffic).

Commands (one JSON object per line; each is answered with one JSON line once done):
- `{"cmd": "start", "spec": {...}}`: start one agent per node of spec (see AgentSpec);
- `{"cmd": "restart", "config": {"splitboard": b, "replicas": n, "plain": b}}`: a config rollout (DRA drivers):
  every driver stopped and started again with the new ix-config at once, as a DaemonSet update with no surge
  limit does;
- `{"cmd": "xid", "nodes": [i, ...], "xid": 79}`: the chip 1 of board 0 of these nodes reports the XID;
- `{"cmd": "prepare", "pods": {node: [[claim, ...], ...]}}`: what the kubelet asks when the pods start: one
  NodePrepareResources per pod with its claims (each `{"namespace", "name", "uid"}`), then until the claims'
  status is written; `{"cmd": "unprepare", "pods": ...}`: the same claims unprepared, one by one, as when the
  pods end;
- `{"cmd": "counts"}`: the client-side requests and bytes since the last `counts`, then zeroed;
- `{"cmd": "stop"}`: every driver stopped; the process exits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ix_device_plugin.apiserver.settings import InCluster, KubeSettings
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.deviceplugin.registrar import Registrar
from ix_device_plugin.dra.driver import DraDriver
from ix_device_plugin.dra.prepared import ClaimRef
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.options import DraOptions, NodeOptions, Options
from ix_device_plugin.settings.table import DRA, RUN
from ix_device_plugin.standins.waits import until

NAMESPACE = "kube-system"
COMMAND_LIMIT = 64 * 2**20  # bytes of one command line
STATUS_TIMEOUT = 120.0  # seconds the claims' status writes may take
STOP_TIMEOUT = 30.0  # hundreds of plugins stop at once in one process: the product's 1.5 s is for one
HEALTH_INTERVAL = 5.0  # the product's default poll is shorter; the fleet's polls read files, not API objects
DEVICE_PLUGIN = "deviceplugin"
# The device plugin's ix-config keys (files of its config directory), as the chart's ConfigMap would hold them:
# `default` is the file in force without the node label, `replicas` the one the label `replicas` picks.
DEVICE_PLUGIN_CONFIGS = {
    "default": {"flags": {"usevolcano": True}},
    "replicas": {"flags": {"usevolcano": True}, "sharing": {"timeSlicing": {"replicas": 4}}},
}


@dataclass(frozen=True)
class AgentSpec:
    """What the agent host runs: nodes[i] with token_files[i], against server (trusting ca), boards per node."""

    server: str
    ca: str
    nodes: list[str]
    token_files: list[str]
    boards: int
    config: dict[str, Any]
    kind: str = "dra"  # or DEVICE_PLUGIN


class Traffic:
    """Requests and bytes the agents' HTTP clients sent and received, counted as they happen."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.bytes_sent = 0
        self.bytes_received = 0

    def install(self, http_client: Any) -> None:
        """Count every request and answer of this client (an httpx client)."""
        hooks = http_client.event_hooks
        http_client.event_hooks = {
            "request": [*hooks.get("request", []), self._request],
            "response": [*hooks.get("response", []), self._response],
        }

    async def _request(self, request: Any) -> None:
        verb = "WATCH" if request.url.params.get("watch") in ("true", "1") else request.method
        self.requests[verb] += 1
        self.bytes_sent += len(request.content or b"") + sum(len(k) + len(v) + 4 for k, v in request.headers.raw)

    async def _response(self, response: Any) -> None:
        response.stream = _CountedStream(response.stream, self)

    def take(self) -> dict[str, Any]:
        """The counts so far, zeroed."""
        counts = {"requests": dict(self.requests), "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received}
        self.requests, self.bytes_sent, self.bytes_received = Counter(), 0, 0
        return counts


def _counted_stream_class() -> type:
    import httpx2

    class CountedStream(httpx2.AsyncByteStream):
        """An answer's body, counted as it streams in."""

        def __init__(self, stream: Any, traffic: Traffic) -> None:
            self._stream = stream
            self._traffic = traffic

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self._stream:
                self._traffic.bytes_received += len(chunk)
                yield chunk

        async def aclose(self) -> None:
            await self._stream.aclose()

    return CountedStream


_CountedStream = _counted_stream_class()


class HollowDraDriver(DraDriver):
    """The DRA driver with no kubelet side; `plain` publishes chips only (no counters, no boards): the baseline."""

    plain = False
    traffic: Traffic | None = None

    async def _serve(self) -> None:
        if self.plain and self.publisher is not None:
            self.publisher.counters = False
        if self.traffic is not None and self.kube is not None:
            self.traffic.install(self.kube._client._client._client)


class NoKubelet(Registrar):
    """A registrar with no kubelet to register with: it waits for ever instead of looking for kubelet.sock."""

    async def run(self) -> None:
        await asyncio.Event().wait()


class HollowDaemon(Daemon):
    """The device plugin's Daemon with no kubelet side: no registration, no probe port (health_address off)."""

    traffic: Traffic | None = None

    async def start(self) -> None:
        self.registrar = NoKubelet(self.options.plugin_dir, "", lambda: self.plan.resource_name, self.metrics)
        if self.traffic is not None and self.apiserver is not None:
            kube = await self.apiserver.kube()  # the client only: no request is made
            self.traffic.install(kube._client._client._client)
        await super().start()


class HollowNode:
    """One hollow node's files and its DRA driver."""

    def __init__(self, root: Path, name: str, token_file: Path, spec: AgentSpec) -> None:
        self.root = root
        self.name = name
        self.devices_file = root / "devices.yaml"
        self.boards = [{"product": "BI-V150"} for _ in range(spec.boards)]
        self.write_devices()
        (root / "boot_id").write_text("boot-1\n")
        self.settings = KubeSettings(name, NAMESPACE, in_cluster=InCluster(spec.server, token_file, Path(spec.ca)))
        self.driver: HollowDraDriver | None = None

    def write_devices(self) -> None:
        self.devices_file.write_text(yaml.safe_dump({"boards": self.boards}))

    def options(self, config: dict[str, Any]) -> DraOptions:
        base = NodeOptions(
            mode=DRA,
            backend="simulated",
            simulated_devices=str(self.devices_file),
            dev_root=self.root,
            sysfs_root=self.root / "sys",
            cdi_spec_dir=self.root / "cdi",
            health_interval=HEALTH_INTERVAL,
            health_address="off",
        )
        ix_config = Config(splitboard=bool(config.get("splitboard")), replicas=int(config.get("replicas", 0)))
        return DraOptions(
            base=base,
            node_name=self.name,
            registrar_dir=self.root / "registry",
            plugins_dir=self.root / "plugins",
            config=ix_config,
            boot_id_path=self.root / "boot_id",
        )

    async def start(self, config: dict[str, Any], traffic: Traffic) -> None:
        driver = HollowDraDriver(self.options(config), kube_settings=self.settings)
        driver.plain = bool(config.get("plain"))
        driver.traffic = traffic
        await driver.start()
        self.driver = driver

    async def stop(self) -> None:
        if self.driver is not None:
            await self.driver.shutdown()
            self.driver = None

    def xid(self, xid: int) -> None:
        self.boards[0] = {"product": "BI-V150", "chips": [None, {"xids": [xid]}]}
        self.write_devices()

    async def prepare(self, pods: list[list[dict[str, str]]]) -> list[str]:
        """Each pod's claims prepared in one call, the pods at once, then until their status is written; the
        errors."""
        driver = self._running()
        calls = [driver.prepare_claims([ClaimRef(**claim) for claim in claims]) for claims in pods]
        outcomes = [outcome for answer in await asyncio.gather(*calls) for outcome in answer]
        await self._status_written()
        return [outcome for outcome in outcomes if isinstance(outcome, str)]

    async def unprepare(self, pods: list[list[dict[str, str]]]) -> list[str]:
        """Every claim of these pods unprepared, then until their status is cleared; the errors."""
        driver = self._running()
        refs = [ClaimRef(**claim) for claims in pods for claim in claims]
        errors = await asyncio.gather(*(driver.unprepare_claim(ref) for ref in refs))
        await self._status_written()
        return [error for error in errors if error is not None]

    def _running(self) -> HollowDraDriver:
        if self.driver is None:
            raise RuntimeError(f"{self.name}: no driver running")
        return self.driver

    async def _status_written(self) -> None:
        api_side = self._running().api_side
        if api_side is not None:
            writer = api_side.claim_status
            await until(lambda: not writer.under_way, timeout=STATUS_TIMEOUT, interval=0.05, message="claim status")


class HollowPluginNode(HollowNode):
    """One hollow node's files and its device plugin (the config directory of DEVICE_PLUGIN_CONFIGS)."""

    def __init__(self, root: Path, name: str, token_file: Path, spec: AgentSpec) -> None:
        super().__init__(root, name, token_file, spec)
        self.config_dir = root / "config"
        self.config_dir.mkdir()
        for key, config in DEVICE_PLUGIN_CONFIGS.items():
            (self.config_dir / key).write_text(yaml.safe_dump(config))
        self.daemon: HollowDaemon | None = None

    def plugin_options(self) -> Options:
        """The plugin's options: simulated boards, the `default` key in force, per-node config, nothing on the
        node beyond its own directory."""
        (self.root / "plugins").mkdir(exist_ok=True)
        return Options(
            mode=RUN,
            backend="simulated",
            simulated_devices=str(self.devices_file),
            dev_root=self.root,
            sysfs_root=self.root / "sys",
            health_interval=HEALTH_INTERVAL,
            health_address="off",
            config_path=self.config_dir / "default",
            config_required=True,
            plugin_dir=self.root / "plugins",
            node_name=self.name,
            per_node_config=True,
            stop_timeout=STOP_TIMEOUT,
        )

    async def start(self, config: dict[str, Any], traffic: Traffic) -> None:
        daemon = HollowDaemon(self.plugin_options(), kube=self.settings)
        daemon.traffic = traffic
        await daemon.start()
        self.daemon = daemon

    async def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.service.stop()
            await self.daemon.shutdown()
            self.daemon = None


class AgentHost:
    """The hollow nodes of one process and the commands that drive them."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="ix-fleet-agents-"))
        self.nodes: list[HollowNode] = []
        self.traffic = Traffic()

    async def start(self, spec: AgentSpec) -> dict[str, Any]:
        for index, (name, token) in enumerate(zip(spec.nodes, spec.token_files, strict=True)):
            root = self.directory / str(index)
            root.mkdir()
            kind = HollowPluginNode if spec.kind == DEVICE_PLUGIN else HollowNode
            self.nodes.append(kind(root, name, Path(token), spec))
        started = time.perf_counter()
        await asyncio.gather(*(node.start(spec.config, self.traffic) for node in self.nodes))
        return {"started_s": round(time.perf_counter() - started, 3)}

    async def restart(self, config: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        await asyncio.gather(*(node.stop() for node in self.nodes))
        await asyncio.gather(*(node.start(config, self.traffic) for node in self.nodes))
        return {"restarted_s": round(time.perf_counter() - started, 3)}

    def xid(self, indices: list[int], xid: int) -> dict[str, Any]:
        for index in indices:
            self.nodes[index].xid(xid)
        return {"xids": len(indices)}

    async def claims(self, verb: str, pods: dict[str, list[list[dict[str, str]]]]) -> dict[str, Any]:
        """Prepare or unprepare the claims of pods (by node name) on their nodes at once; the claims and errors."""
        by_name = {node.name: node for node in self.nodes}
        started = time.perf_counter()
        work = [getattr(by_name[name], verb)(node_pods) for name, node_pods in pods.items()]
        errors = [error for node_errors in await asyncio.gather(*work) for error in node_errors]
        claims = sum(len(claims) for node_pods in pods.values() for claims in node_pods)
        seconds = round(time.perf_counter() - started, 3)
        return {"claims": claims, "errors": errors[:5], "failed": len(errors), "seconds": seconds}

    async def stop(self) -> dict[str, Any]:
        await asyncio.gather(*(node.stop() for node in self.nodes))
        return {}

    async def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        match command.get("cmd"):
            case "start":
                return await self.start(AgentSpec(**command["spec"]))
            case "restart":
                return await self.restart(command["config"])
            case "xid":
                return self.xid(command["nodes"], int(command.get("xid", 79)))
            case "prepare" | "unprepare":
                return await self.claims(command["cmd"], command["pods"])
            case "counts":
                return self.traffic.take()
            case "stop":
                return await self.stop()
        raise ValueError(f"unknown command {command!r}")


async def serve() -> int:
    """Answer the commands on stdin until `stop` or the end of stdin."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=COMMAND_LIMIT)  # a prepare names every claim of up to 250 nodes
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    host = AgentHost()
    try:
        while line := await reader.readline():
            command = json.loads(line)
            try:
                answer = {"ok": True, **(await host.handle(command))}
            except Exception as error:  # reported to the bench, which stops the run with it
                answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            print(json.dumps(answer), flush=True)
            if command.get("cmd") == "stop":
                return 0
    finally:
        await host.stop()
    return 0


def main() -> int:
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr, format="%(name)s: %(message)s")
    return asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
