"""The GPU reset's machinery is built at its first use (gpureset/service.py): a device plugin with nothing to reset
never loads it, and a configuration reloaded to turn self-healing or flags.reset_gpu on resets as it did when the
machinery was built at start."""

from __future__ import annotations

import sys
from pathlib import Path

from helpers.broken_chip import BrokenChip
from helpers.reset_support import CHIP_A, CHIP_B, FAST, Ixsmi, devices_file
from helpers.support import RESOURCE, DaemonFactory, metric
from helpers.waits import stays, until

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.tools.demo import ConfigMapDir


async def test_self_healing_turned_on_by_a_reload_resets_the_chip_it_left_out(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, short_dir: Path
) -> None:
    configmap = ConfigMapDir(short_dir / "ixconfig")
    configmap.write("health:\n  selfHealing: false\n")
    daemon, view = await broken_chip.started(kube=None, config_path=configmap.path, config_required=True)
    broken_chip.breaks(1, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    await stays(lambda: ixsmi.runs() == [], for_=0.5, message="ixsmi.runs() == []")
    assert not daemon.node.gpu_reset.built  # told, not reset: nothing needed the machinery yet

    configmap.write("health:\n  selfHealing: true\n")
    await until(lambda: daemon.config.self_healing == "true")
    # The reload alone, with no news of the chips: the healer looks at every chip again and resets the one left out.
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=10)
    assert ixsmi.runs() == ["-r -i GPU-x1"]
    assert view.devices["GPU-x0"] == HEALTHY
    assert metric(daemon, "ix_device_plugin_healing_resets_total", result="ok") == 1
    assert metric(daemon, "ix_device_plugin_healing_outcomes_total", outcome="healed") == 1
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="ok") == 1
    assert "ix_device_plugin.gpureset.sequence" in sys.modules


async def test_reset_gpu_turned_on_by_a_reload_resets_before_the_next_allocate(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, tmp_path: Path, short_dir: Path
) -> None:
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    configmap = ConfigMapDir(short_dir / "ixconfig")
    configmap.write("flags:\n  reset_gpu: false\n")
    daemon = await start_daemon(
        backend_factory=lambda: backend,
        config_path=configmap.path,
        config_required=True,
        reset_wait_timeout=FAST.wait_timeout,
        reset_timeout=FAST.command_timeout,
    )
    await kubelet.wait_registered(RESOURCE, capacity=2)
    await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert backend.resets == [] and not daemon.node.gpu_reset.built

    configmap.write("flags:\n  reset_gpu: true\n")
    await until(lambda: daemon.config.reset_gpu)
    response = await kubelet.allocate(RESOURCE, [[CHIP_B]])
    assert response.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_B
    assert backend.resets == [(CHIP_B,)]
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="ok") == 1
    assert metric(daemon, "ix_device_plugin_gpu_reset_duration_seconds_count") == 1
