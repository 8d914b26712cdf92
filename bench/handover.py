"""Device plugin upgrades: two pods on one node, the new one registering beside the old one (a kubelet 1.37+
stand-in), then the old one stopping; rounds of it on one node, each new pod the next round's old one.

Per round: how long the new pod takes to be registered beside the old one, how long the old one's stop takes and
how long after it the new one acts for the node; the lowest allocatable the kubelet stand-in saw across every
round (the node's GPU count when nothing dropped); and Allocate's time through the pod on standby, which reads the
node-health record at every call.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from bench.plugin import short_dir
from bench.settings import Settings
from bench.stats import summary_ms
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.settings.options import Options
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.waits import until

RESOURCE = "iluvatar.com/gpu"
DEVICES = "BI-V150:8"  # 8 boards: 8 GPUs
ALLOCATES = 200  # Allocate calls per round, through the pod on standby


def _options(root: Path) -> Options:
    return Options(
        plugin_dir=root / "device-plugins",
        config_path=root / "no-config",
        dev_root=root,
        health_address="off",
        telemetry_interval=None,
        pod_resources_socket=None,
        cdi_spec_dir=root / "cdi",
        node_feature_dir=None,
        kubelet_plugins_directory_path=root / "plugins",
        zero_downtime_upgrade="true",
        pod_uid=str(uuid.uuid4()),
    )


async def _start(root: Path) -> Daemon:
    daemon = Daemon(_options(root), backend_factory=lambda: SimulatedBackend(DEVICES))
    await daemon.start()
    return daemon


def _beside_and_followed(kubelet: KubeletStandIn, messages_before: int) -> bool:
    """Two pods registered, and a ListAndWatch message read since messages_before (the new pod's first)."""
    view = kubelet.resources[RESOURCE]
    return len(kubelet.endpoints(RESOURCE)) == 2 and len(view.allocatable_seen) > messages_before


async def run(settings: Settings) -> dict[str, Any]:
    """Times of settings.handovers rounds of an update on one node."""
    root = short_dir()
    (root / "device-plugins").mkdir()
    kubelet = KubeletStandIn(root / "device-plugins")
    await kubelet.start()
    beside: list[float] = []
    stops: list[float] = []
    takeovers: list[float] = []
    allocates: list[float] = []
    try:
        old = await _start(root)
        view = await kubelet.wait_registered(RESOURCE, capacity=8)
        seen_from = len(view.allocatable_seen)
        for _ in range(settings.handovers):
            messages = len(kubelet.resources[RESOURCE].allocatable_seen)
            started = time.perf_counter()
            new = await _start(root)
            # registered, and its first ListAndWatch message read: the kubelet follows the new pod from then on
            await until(lambda: _beside_and_followed(kubelet, messages), timeout=10, interval=0.001)  # noqa: B023 (awaited in the round)
            beside.append(time.perf_counter() - started)
            for _ in range(ALLOCATES):
                called = time.perf_counter()
                await kubelet.allocate(RESOURCE, [[new.plan.devices[0].id]])
                allocates.append(time.perf_counter() - called)
            stopping = time.perf_counter()
            await old.shutdown()
            stopped = time.perf_counter()
            await until(lambda: new.acting, timeout=10, interval=0.001)  # noqa: B023 (awaited within the round)
            stops.append(stopped - stopping)
            takeovers.append(time.perf_counter() - stopped)
            old = new
        seen = kubelet.resources[RESOURCE].allocatable_seen[seen_from:]  # before the last pod's stop takes it away
        await old.shutdown()
    finally:
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "rounds": settings.handovers,
        "gpus": 8,
        "lowest_allocatable": min(seen) if seen else None,
        "registered_beside": summary_ms(beside),
        "old_pod_stop": summary_ms(stops),
        "takeover_after_stop": summary_ms(takeovers),
        "allocate_on_standby": summary_ms(allocates),
    }
