"""The daemon keeps the CDI spec and the NFD feature file in step with what it serves."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from helpers.support import RESOURCE, DaemonFactory
from helpers.waits import until

from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.tools.demo import ConfigMapDir

SPEC = "iluvatar.com-gpu.yaml"
FEATURES = "ix-device-plugin"


def labels(directory: Path) -> dict[str, str]:
    lines = (directory / FEATURES).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def spec_devices(directory: Path) -> list[str]:
    return [device["name"] for device in yaml.safe_load((directory / SPEC).read_text())["devices"]]


async def test_spec_and_labels_follow_hot_plug_and_reload(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    cdi, features = short_dir / "cdi", short_dir / "features.d"
    devices = short_dir / "devices.yaml"
    devices.write_text("boards:\n  - product: BI-V150\n")
    configmap = ConfigMapDir(short_dir / "ixconfig")
    configmap.write("flags:\n  splitboard: false\n")
    daemon = await start_daemon(
        str(devices),
        cdi_spec_dir=cdi,
        node_feature_dir=features,
        config_path=configmap.path,
        config_required=True,
        rediscover_interval=0.3,
    )
    await kubelet.wait_registered(RESOURCE, capacity=1)
    chips = [chip.uuid for chip in daemon.inventory.chips()]
    assert spec_devices(cdi) == [*chips, "all"]
    assert labels(features)["iluvatar.com/gpu.count"] == "2"
    assert labels(features)["iluvatar.com/gpu.replicas"] == "1"

    devices.write_text("boards:\n  - product: BI-V150\n  - product: BI-V100\n")
    await kubelet.wait_registered(RESOURCE, capacity=2, timeout=5)
    await until(lambda: len(spec_devices(cdi)) == 4, timeout=3)
    assert labels(features)["iluvatar.com/gpu.boards"] == "2"

    configmap.write("sharing:\n  timeSlicing:\n    replicas: 4\n")
    await kubelet.wait_registered(RESOURCE, capacity=8, timeout=5)
    await until(lambda: labels(features)["iluvatar.com/gpu.replicas"] == "4", timeout=3)
    assert labels(features)["iluvatar.com/gpu.sharing-strategy"] == "time-slicing"

    before = labels(features)
    await daemon.shutdown()
    assert (cdi / SPEC).exists()  # a container restarted while the plugin is down still needs it
    # handed over: the labels hold for the agent that follows, then NFD drops them
    assert (features / FEATURES).read_text().startswith("# +expiry-time=")
    assert labels(features) == before


async def test_an_unwritable_feature_dir_is_logged_once_and_retried(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="ix_device_plugin.deviceplugin.daemon")
    blocked = short_dir / "features.d"
    blocked.write_text("a file where the directory should be")
    await start_daemon("BI-V100:2", node_feature_dir=blocked)
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    assert view.allocatable == 2  # device plugging does not depend on the labels
    await until(lambda: any("node labels not written" in r.getMessage() for r in caplog.records), timeout=3)
    blocked.unlink()
    await until(lambda: (blocked / FEATURES).exists(), timeout=5)
    failures = [r for r in caplog.records if "node labels not written" in r.getMessage()]
    assert len(failures) == 1
