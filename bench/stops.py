"""Stopping under load: SIGTERM at random moments around kubelet sessions, restarts and reloads,
with every core kept busy. Each stop must exit 0 within 2 s and remove the plugin's socket."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.settings import Settings
from bench.stats import summary_ms
from ix_device_plugin.deviceplugin.endpoint import ENDPOINT
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.tools.demo import ConfigMapDir

RESOURCE = "iluvatar.com/gpu"
STOP_BOUND = 2.0
CONFIGS = (
    "flags:\n  splitboard: false\n",
    "flags:\n  splitboard: true\n",
    "sharing:\n  timeSlicing:\n    replicas: 3\n",
)
Action = Callable[["Stage"], Awaitable[None]]


@dataclass(frozen=True)
class StopResult:
    """One stop: what happened just before SIGTERM, how long the exit took, and what it left."""

    action: str
    seconds: float
    exit_code: int | None
    socket_left: bool

    @property
    def ok(self) -> bool:
        """Exited 0 within the bound and removed its socket."""
        return self.exit_code == 0 and self.seconds < STOP_BOUND and not self.socket_left


@dataclass
class Stage:
    """One plugin process with its kubelet stand-in and ConfigMap directory."""

    root: Path
    kubelet: KubeletStandIn
    configmap: ConfigMapDir
    process: subprocess.Popen[bytes]

    @property
    def socket(self) -> Path:
        """The plugin's socket."""
        return self.root / "device-plugins" / ENDPOINT


async def _session_ends(stage: Stage) -> None:
    await stage.kubelet.stop()


async def _kubelet_restarts(stage: Stage) -> None:
    await stage.kubelet.restart()


async def _config_reloads(stage: Stage) -> None:
    stage.configmap.write(random.choice(CONFIGS))


async def _sighup(stage: Stage) -> None:
    stage.process.send_signal(signal.SIGHUP)


async def _socket_deleted(stage: Stage) -> None:
    stage.socket.unlink(missing_ok=True)


async def _nothing(stage: Stage) -> None:
    return None


ACTIONS: dict[str, Action] = {
    "kubelet session ended": _session_ends,
    "kubelet restarted": _kubelet_restarts,
    "config reloaded": _config_reloads,
    "SIGHUP": _sighup,
    "socket deleted": _socket_deleted,
    "nothing": _nothing,
}


@contextmanager
def busy_cores(seconds: float) -> Iterator[None]:
    """Keep every core busy with bounded loops (each ends by itself after `seconds`)."""
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
    workers = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()


def _spawn(root: Path, config: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "ix_device_plugin",
        "run",
        "--backend",
        "simulated",
        "--simulated-devices",
        "BI-V150:2",
        "--device-plugin-path",
        str(root / "device-plugins"),
        "--kubelet-plugins-directory-path",
        str(root / "plugins"),
        "--config",
        str(config),
        "--health-address",
        "off",
        "--cdi-spec-dir",
        "off",
        "--node-feature-dir",
        "off",
        "--health-interval",
        "0.2",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IX_")}
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


async def one_stop(action: str, delay: float) -> StopResult:
    """Start a plugin, let it register, do action, wait delay seconds, SIGTERM it and time the exit."""
    root = Path(tempfile.mkdtemp(prefix="ixstop-", dir="/tmp"))
    kubelet = KubeletStandIn(root / "device-plugins")
    configmap = ConfigMapDir(root / "ixconfig")
    configmap.write(CONFIGS[0])
    await kubelet.start()
    stage = Stage(root, kubelet, configmap, _spawn(root, configmap.path))
    try:
        await kubelet.wait_registered(RESOURCE, timeout=20)
        await ACTIONS[action](stage)
        await asyncio.sleep(delay)
        started = time.perf_counter()
        stage.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = await asyncio.to_thread(stage.process.wait, 10)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.perf_counter() - started
        return StopResult(action, seconds, code, stage.socket.exists())
    finally:
        if stage.process.poll() is None:
            stage.process.kill()
            stage.process.wait()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


async def stop_storm(stops: int, seed: int) -> list[StopResult]:
    """stops stops, each after a random action and a random delay of 0-50 ms (reproducible from seed)."""
    chooser = random.Random(seed)
    results = []
    for _ in range(stops):
        action = chooser.choice(sorted(ACTIONS))
        results.append(await one_stop(action, chooser.uniform(0, 0.05)))
    return results


async def run(settings: Settings) -> dict[str, Any]:
    """The stop storm with every core busy: how many stops, how many failed, and their times."""
    with busy_cores(seconds=max(30.0, settings.stops * 3.0)):
        results = await stop_storm(settings.stops, seed=20261202)
    failed = [result for result in results if not result.ok]
    for result in failed:
        print(f"\nstop failed: {result}", file=sys.stderr)
    return {"stops": len(results), "failed": len(failed), **summary_ms([result.seconds for result in results])}
