"""The plugin as a separate process on simulated devices, registered with a kubelet stand-in."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
import yaml

from ix_device_plugin.api import api_pb2
from ix_device_plugin.core.products import PRODUCTS
from ix_device_plugin.deviceplugin.endpoint import ENDPOINT
from ix_device_plugin.hardware.simulated import default_uuid
from ix_device_plugin.kubelet.sockets import unix_target
from ix_device_plugin.standins.kubelet import KubeletStandIn, ResourceView
from ix_device_plugin.standins.waits import WaitFailed, until

RESOURCE = "iluvatar.com/gpu"
START_TIMEOUT = 15.0
_live: set[subprocess.Popen[bytes]] = set()


def _kill_leftovers() -> None:
    for process in list(_live):
        with contextlib.suppress(OSError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=2)
        _live.discard(process)


atexit.register(_kill_leftovers)


def short_dir() -> Path:
    """A new temporary directory with a short path: unix socket paths are limited to 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="ixb-", dir="/tmp"))


@dataclass(frozen=True)
class Node:
    """A simulated node and the configuration that shapes what the plugin advertises for it."""

    label: str
    product: str
    boards: int
    splitboard: bool = False
    replicas: int = 0

    @property
    def spec(self) -> str:
        """The `--simulated-devices` spec of the node."""
        return f"{self.product}:{self.boards}"

    @property
    def chips_per_board(self) -> int:
        """Chips on each board of the node."""
        return PRODUCTS[self.product].chips_per_board

    @property
    def capacity(self) -> int:
        """Devices the plugin advertises for the node."""
        gpus = self.boards * (self.chips_per_board if self.splitboard else 1)
        return gpus * (self.replicas if self.replicas >= 2 else 1)

    def config_yaml(self, replicas: int | None = None) -> str:
        """The ix-config file for the node, optionally with another replica count."""
        count = self.replicas if replicas is None else replicas
        document = {"flags": {"splitboard": self.splitboard}, "sharing": {"timeSlicing": {"replicas": count}}}
        return yaml.safe_dump(document, sort_keys=False)

    def devices_yaml(self, first_chip_errors: tuple[str, ...] = ()) -> str:
        """A simulated devices file for the node; the first chip reports first_chip_errors."""
        boards: list[dict[str, Any]] = [{"product": self.product} for _ in range(self.boards)]
        if first_chip_errors:
            chips: list[dict[str, Any] | None] = [{"health": list(first_chip_errors)}]
            boards[0]["chips"] = chips + [None] * (self.chips_per_board - 1)
        return yaml.safe_dump({"boards": boards}, sort_keys=False)

    def first_chip_device(self) -> str:
        """The ID of the first device advertised for the first chip."""
        gpu = default_uuid(0, 0)
        return f"{gpu}::0" if self.replicas >= 2 else gpu


ONE_GPU = Node("1 GPU (BI-V100:1)", "BI-V100", 1)
LARGE = Node("16 x BI-V150, split, 64 replicas", "BI-V150", 16, splitboard=True, replicas=64)


class TimedStandIn(KubeletStandIn):
    """The kubelet stand-in, noting when each registration has succeeded."""

    def __init__(self, plugin_dir: Path) -> None:
        super().__init__(plugin_dir)
        self.registered_at: list[float] = []

    async def Register(self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext) -> api_pb2.Empty:
        """Register as the stand-in does, then note the time."""
        response = await super().Register(request, context)
        self.registered_at.append(time.perf_counter())
        return response


def write_atomically(path: Path, text: str) -> None:
    """Replace path's content at once, as the kubelet swaps a ConfigMap."""
    staging = path.with_name(f".{path.name}.new")
    staging.write_text(text)
    staging.replace(path)


class PluginProcess:
    """`ix-device-plugin run` on a simulated node in a temporary directory, with a kubelet stand-in.

    Settings come from a config file (so they can be edited live); devices from the spec, or from a
    YAML file when health is to be changed. Use as `async with`: the process is always killed on exit.
    """

    def __init__(
        self,
        node: Node,
        *,
        health_interval: float | None = None,
        devices_file: bool = False,
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.node = node
        self.health_interval = health_interval
        self.extra_args = extra_args
        self.extra_env = extra_env or {}
        self.workdir = short_dir()
        self.plugin_dir = self.workdir / "dp"
        self.config_path = self.workdir / "ix-config"
        self.devices_path = self.workdir / "devices.yaml" if devices_file else None
        self.log_path = self.workdir / "plugin.log"
        self.kubelet = TimedStandIn(self.plugin_dir)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The plugin's process ID."""
        assert self.process is not None
        return self.process.pid

    @property
    def target(self) -> str:
        """The gRPC target of the plugin's socket."""
        return unix_target(self.plugin_dir / ENDPOINT)

    def command(self) -> list[str]:
        """The command line that runs the plugin."""
        devices = str(self.devices_path) if self.devices_path is not None else self.node.spec
        command = [sys.executable, "-m", "ix_device_plugin", "run", "--backend", "simulated"]
        command += ["--simulated-devices", devices, "--config", str(self.config_path)]
        command += ["--device-plugin-path", str(self.plugin_dir), "--dev-root", str(self.workdir)]
        # The device plugin alone unless extra_args turn node-agent parts on (the last flag given wins).
        command += ["--health-address", "off", "--cdi-spec-dir", "off", "--node-feature-dir", "off"]
        command += ["--telemetry-interval", "off", "--pod-resources-socket", "off"]
        command += ["--kubelet-plugins-directory-path", str(self.workdir / "plugins")]
        if self.health_interval is not None:
            command += ["--health-interval", str(self.health_interval)]
        return [*command, *self.extra_args]

    async def __aenter__(self) -> Self:
        (self.workdir / "dev").mkdir()
        self.config_path.write_text(self.node.config_yaml())
        if self.devices_path is not None:
            self.devices_path.write_text(self.node.devices_yaml())
        await self.kubelet.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    def spawn(self) -> float:
        """Start the process; the perf_counter time just before it was started."""
        with self.log_path.open("ab") as log:
            started = time.perf_counter()
            env = {**os.environ, **self.extra_env}
            self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        _live.add(self.process)
        return started

    async def launch(self) -> ResourceView:
        """Start the process and wait until the stand-in has its full device list."""
        self.spawn()
        return await self.wait_listed()

    async def wait_listed(self, timeout: float = START_TIMEOUT) -> ResourceView:
        """Wait until the plugin is registered with its full list; fails early if the process exits."""
        listed = asyncio.create_task(self.kubelet.wait_registered(RESOURCE, timeout, capacity=self.node.capacity))
        exited = asyncio.create_task(self._exited())
        done, _ = await asyncio.wait({listed, exited}, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        if listed not in done:
            listed.cancel()
            raise RuntimeError(
                f"the plugin exited with code {self.process and self.process.poll()}:\n{self.log_tail()}"
            )
        try:
            return listed.result()
        except TimeoutError:
            raise RuntimeError(f"the plugin did not register within {timeout:g}s:\n{self.log_tail()}") from None

    async def waits_for(self, done: Callable[[], Any], what: str, timeout: float, interval: float = 0.05) -> None:
        """Wait until done() holds; a RuntimeError naming what, with the plugin's log tail, if not within timeout."""
        try:
            await until(done, timeout=timeout, interval=interval, message=what)
        except WaitFailed as failed:
            raise RuntimeError(f"{failed}:\n{self.log_tail()}") from None

    async def _exited(self) -> None:
        """Return once the process has exited (the caller cancels this wait once the plugin is listed)."""
        await until(lambda: self.process is None or self.process.poll() is not None, timeout=math.inf, interval=0.05)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the plugin logged."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def close(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL), the stand-in, and remove the directory."""
        if self.process is not None:
            await stop_process(self.process)
            self.process = None
        await self.kubelet.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


async def stop_process(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """Terminate process, kill it if it has not exited after grace seconds, and reap it."""
    if process.poll() is None:
        with contextlib.suppress(OSError):
            process.terminate()
        with contextlib.suppress(WaitFailed):  # still running after grace: killed below
            await until(lambda: process.poll() is not None, timeout=grace, interval=0.02)
        if process.poll() is None:
            with contextlib.suppress(OSError):
                process.kill()
            await asyncio.to_thread(process.wait)
    _live.discard(process)


def track(process: subprocess.Popen[bytes]) -> None:
    """Kill process when the benchmark exits, whatever happens."""
    _live.add(process)
