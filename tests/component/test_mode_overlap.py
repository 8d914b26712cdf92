"""A node switched between the device plugin and DRA: the kubelet stops the one mode's pod and starts the other's in
no fixed order, so both run for a while on one node. One acts for the node (the plugin's node files, labels and
healing; the driver's ResourceSlices), the other waits on standby, whichever started second, and takes over when the
first lets go. A pod of the release before, holding its mode's old lock, is waited for the same way."""

from __future__ import annotations

from pathlib import Path

from helpers.dra_support import DraNode
from helpers.support import DaemonFactory
from helpers.waits import stays, until

from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.runtime.locks import FileLock
from ix_device_plugin.runtime.noderole import EARLIER_PLUGIN_ROLE
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

OVERLAP = 0.5  # seconds both pods are watched side by side
ALL_DEVICES = 6  # the DRA node's 4 chips and 2 boards


def dra_node(short_dir: Path, apiserver: ApiServerStandIn) -> DraNode:
    (short_dir / "node").mkdir()
    return DraNode(short_dir / "node", apiserver)


async def start_plugin(start_daemon: DaemonFactory, node: DraNode) -> Daemon:
    """The device plugin on the DRA node's chips, with the same kubelet plugins directory (the node's)."""
    return await start_daemon(str(node.devices_file), kubelet_plugins_directory_path=node.root / "plugins")


async def test_a_driver_started_beside_the_acting_plugin_waits_and_publishes_once_the_plugin_stops(
    short_dir: Path, apiserver: ApiServerStandIn, kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    node = dra_node(short_dir, apiserver)
    try:
        daemon = await start_plugin(start_daemon, node)
        await kubelet.wait_registered(daemon.plan.resource_name)
        assert daemon.acting
        driver = await node.start()
        assert not driver.node.role.held and not driver.node.acting
        await stays(lambda: daemon.acting and not driver.node.role.held and node.slice() is None, OVERLAP)
        await daemon.shutdown()  # the plugin's pod leaves the node
        await node.wait_slice(lambda devices: len(devices) == ALL_DEVICES, timeout=5)
        assert driver.node.role.held and driver.node.acting
    finally:
        await node.stop_all()


async def test_a_plugin_started_beside_the_publishing_driver_waits_and_acts_once_the_driver_stops(
    short_dir: Path, apiserver: ApiServerStandIn, kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    node = dra_node(short_dir, apiserver)
    try:
        driver = await node.start()
        await node.wait_slice(lambda devices: len(devices) == ALL_DEVICES, timeout=5)
        daemon = await start_plugin(start_daemon, node)
        assert not daemon.acting and not daemon.node.acting
        await stays(lambda: driver.node.role.held and not daemon.acting, OVERLAP)
        await node.stop(driver)  # the driver's pod leaves the node
        await until(lambda: daemon.acting, timeout=3)
        await kubelet.wait_registered(daemon.plan.resource_name)
        assert daemon.node.acting
    finally:
        await node.stop_all()


async def test_a_driver_does_not_publish_while_a_plugin_of_the_release_before_acts_under_its_old_lock(
    short_dir: Path, apiserver: ApiServerStandIn
) -> None:
    node = dra_node(short_dir, apiserver)
    old_plugin = FileLock(node.root / "plugins" / EARLIER_PLUGIN_ROLE)
    old_plugin.path.parent.mkdir(parents=True)
    assert old_plugin.try_take()
    try:
        driver = await node.start()
        await stays(lambda: not driver.node.role.held and node.slice() is None, OVERLAP)
        old_plugin.release()  # the old pod stops
        await node.wait_slice(lambda devices: len(devices) == ALL_DEVICES, timeout=5)
        assert driver.node.role.held
    finally:
        old_plugin.release()
        await node.stop_all()
