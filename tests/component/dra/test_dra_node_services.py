"""The node services on a DRA node: the device plugin's node labels and the DRA driver's own, kept true."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from dra_support import DraNode

from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.kubelet import KubeletStandIn

from support import DaemonFactory, config_flags, until

FEATURES = "ix-device-plugin"
DRA_LABELS = {"iluvatar.com/dra.driver", "iluvatar.com/dra.chips", "iluvatar.com/dra.boards", "iluvatar.com/dra.shares"}


def labels(directory: Path) -> dict[str, str]:
    """The labels of the feature file in directory, as NFD reads them ({} without a file)."""
    path = directory / FEATURES
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def machine(root: Path) -> Path:
    """A sysfs root whose DMI product name is X580-G30."""
    dmi = root / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "product_name").write_text("X580-G30\n")
    return root


@pytest.mark.parametrize(
    ("flags", "dra"),
    [
        ({}, {"iluvatar.com/dra.chips": "4", "iluvatar.com/dra.boards": "2"}),
        (
            {"splitboard": True, "replicas": "4"},
            {"iluvatar.com/dra.chips": "4", "iluvatar.com/dra.boards": "0", "iluvatar.com/dra.shares": "4"},
        ),
        (
            {"replicas": "2"},
            {"iluvatar.com/dra.chips": "0", "iluvatar.com/dra.boards": "2", "iluvatar.com/dra.shares": "2"},
        ),
    ],
)
async def test_a_dra_node_has_the_device_plugins_labels_and_its_own(
    node: DraNode,
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    short_dir: Path,
    flags: dict[str, str | bool],
    dra: dict[str, str],
) -> None:
    """The same feature file as the device plugin writes for the same node and ix-config, plus the DRA facts."""
    sysfs = machine(short_dir / "sys")
    plugin_dir, driver_dir = short_dir / "plugin-features", short_dir / "driver-features"
    given = config_flags(**flags)
    daemon = await start_daemon(str(node.devices_file), node_feature_dir=plugin_dir, sysfs_root=sysfs, given=given)
    await kubelet.wait_registered(daemon.plan.resource_name)
    config = Config(splitboard=bool(flags.get("splitboard", False)), replicas=int(flags.get("replicas", 0)))
    await node.start(node_feature_dir=driver_dir, sysfs_root=sysfs, config=config)
    await until(lambda: bool(labels(driver_dir)))
    written = labels(driver_dir)
    assert {name: value for name, value in written.items() if name not in DRA_LABELS} == labels(plugin_dir)
    assert {name: value for name, value in written.items() if name in DRA_LABELS} == {
        "iluvatar.com/dra.driver": "gpu.iluvatar.com",
        **dra,
    }
    assert written["iluvatar.com/gpu.product"] == "BI-V150" and written["iluvatar.com/gpu.machine"] == "X580-G30"


async def test_the_labels_follow_health_and_hot_plug(node: DraNode, short_dir: Path) -> None:
    features = short_dir / "features.d"
    await node.start(node_feature_dir=features)
    await until(lambda: labels(features).get("iluvatar.com/gpu.healthy") == "2")
    node.write_boards([{"product": "BI-V150", "chips": [{"health": ["ECC"]}, {}]}, {"product": "BI-V150"}])
    await until(lambda: labels(features)["iluvatar.com/gpu.healthy"] == "1", timeout=3)
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150"}, {"product": "BI-V100"}])
    await until(lambda: labels(features)["iluvatar.com/gpu.boards"] == "3", timeout=3)
    assert labels(features)["iluvatar.com/dra.boards"] == "3"  # the BI-V100 is a whole board and a chip
    assert labels(features)["iluvatar.com/dra.chips"] == "5"


async def test_an_unwritable_feature_dir_is_said_once_and_retried(
    node: DraNode, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="ix_device_plugin.nodelabels")
    blocked = short_dir / "features.d"
    blocked.write_text("a file where the directory should be")
    driver = await node.start(node_feature_dir=blocked)
    await node.wait_slice(lambda devices: len(devices) == 6)  # serving does not depend on the labels
    await until(lambda: any("node labels not written" in r.getMessage() for r in caplog.records))
    blocked.unlink()
    await until(lambda: (blocked / FEATURES).exists(), timeout=8)
    assert len([r for r in caplog.records if "node labels not written" in r.getMessage()]) == 1
    assert driver.service.down() == []


async def test_no_chips_no_labels(node: DraNode, short_dir: Path) -> None:
    features = short_dir / "features.d"
    features.mkdir()
    (features / FEATURES).write_text("iluvatar.com/gpu.present=true\n")  # left by an earlier agent
    node.write_boards([])
    await node.start(node_feature_dir=features, config=Config(fail_on_init_error=False))
    await until(lambda: not (features / FEATURES).exists())
