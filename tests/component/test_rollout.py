"""Two pods of the device plugin on one node during an update (the DaemonSet's surge): each on its own socket,
one acting for the node, the kubelet stand-in keeping several endpoints per resource as the kubelet does from 1.37,
or one as before. What the kubelet sees must never drop, and what is node-wide is done by one pod at a time."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from helpers.broken_chip import BrokenChip
from helpers.reset_support import NAMESPACE, NODE, Ixsmi
from helpers.support import RESOURCE, DaemonFactory, config_flags, metric
from helpers.waits import stays, until

from ix_device_plugin.api import HEALTHY, UNHEALTHY, api_pb2
from ix_device_plugin.apiserver.settings import KubeSettings, settings_from
from ix_device_plugin.core.allocation import AllocationError
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.deviceplugin.endpoint import plugin_socket
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn

OLD, NEW = "0b1d0000-0000-4000-8000-000000000001", "0e2e0000-0000-4000-8000-000000000002"
OLD_SOCKET, NEW_SOCKET = plugin_socket(Path(), OLD).name, plugin_socket(Path(), NEW).name


class Allocatable:
    """What the kubelet stand-in's allocatable for RESOURCE was after every message and disconnect from now on."""

    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._view = kubelet.resources[RESOURCE]
        self._start = len(self._view.allocatable_seen)

    @property
    def seen(self) -> list[int]:
        return self._view.allocatable_seen[self._start :]

    async def heard(self) -> None:
        """Wait for the first ListAndWatch message from now on: a registration's stream is followed only then."""
        await until(lambda: bool(self.seen))


async def start_beside(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, old_socket: str, **options: object
) -> tuple[Daemon, Allocatable]:
    """Start the new pod (NEW, zero downtime on) beside the one registered on old_socket: it is registered and the
    kubelet has read its first ListAndWatch message; allocatable records from before its start."""
    allocatable = Allocatable(kubelet)
    new = await start_daemon(pod_uid=NEW, zero_downtime_upgrade="true", **options)
    await until(lambda: kubelet.endpoints(RESOURCE) == [old_socket, NEW_SOCKET])
    await allocatable.heard()
    return new, allocatable


def node_files(short_dir: Path) -> dict[str, object]:
    return {"cdi_spec_dir": short_dir / "cdi", "node_feature_dir": short_dir / "features"}


def spec(short_dir: Path) -> Path:
    [path] = (short_dir / "cdi").iterdir()
    return path


async def test_a_new_pod_registers_beside_the_old_one_and_takes_over_at_its_stop_without_a_drop(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path, plugin_dir: Path
) -> None:
    old = await start_daemon(pod_uid=OLD, **node_files(short_dir))
    await kubelet.wait_registered(RESOURCE, capacity=2)
    written = spec(short_dir).stat()
    new, allocatable = await start_beside(kubelet, start_daemon, OLD_SOCKET, **node_files(short_dir))
    assert (old.acting, new.acting) == (True, False)
    assert (metric(old, "ix_device_plugin_acting_for_node"), metric(new, "ix_device_plugin_acting_for_node")) == (
        1,
        0,
    )
    assert new.ready() == (True, f"registered {RESOURCE}; standby: another pod acts for the node")
    devices = {"resource": RESOURCE, "health": "Healthy"}  # node-wide figures: from the acting pod alone
    assert (metric(old, "ix_device_plugin_devices", **devices), metric(new, "ix_device_plugin_devices", **devices)) == (
        2,
        0,
    )
    response = await kubelet.admit(RESOURCE, 1)  # the newest registration answers
    assert response.envs["IX_VISIBLE_DEVICES"]
    assert metric(new, "ix_device_plugin_calls_total", method="Allocate") == 1
    assert metric(old, "ix_device_plugin_calls_total", method="Allocate") == 0
    assert spec(short_dir).stat().st_ino == written.st_ino and new.files.due  # the standby wrote nothing
    await old.shutdown()
    await until(lambda: new.acting, timeout=3)
    await until(lambda: kubelet.endpoints(RESOURCE) == [NEW_SOCKET])
    await until(lambda: not new.files.due)  # the CDI spec and labels are its own now
    await kubelet.admit(RESOURCE, 1)
    assert allocatable.seen and set(allocatable.seen) == {2}
    assert kubelet.resources[RESOURCE].connected and kubelet.resources[RESOURCE].allocatable == 2
    assert not (plugin_dir / OLD_SOCKET).exists()


async def test_the_new_pod_that_stops_first_leaves_the_old_one_serving(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    """DP2 changed its mind: it goes away before the old pod, which serves on as the one endpoint."""
    old = await start_daemon(pod_uid=OLD)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    new, allocatable = await start_beside(kubelet, start_daemon, OLD_SOCKET)
    await new.shutdown()
    await until(lambda: kubelet.endpoints(RESOURCE) == [OLD_SOCKET])
    await kubelet.admit(RESOURCE, 2)  # the old pod answers again
    assert old.acting
    assert set(allocatable.seen) == {2}


async def test_on_a_kubelet_before_1_37_the_new_pod_waits_ready_and_registers_once_the_old_one_stopped(
    plugin_dir: Path, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    kubelet = KubeletStandIn(plugin_dir, several_endpoints=False)
    await kubelet.start()
    try:
        kube = node_with_kubelet(apiserver, short_dir, "v1.36.4")
        old = await start_daemon(pod_uid=OLD, kube=kube)
        await kubelet.wait_registered(RESOURCE, capacity=2)
        new = await start_daemon(pod_uid=NEW, kube=kube)
        assert not new.serving_wanted and new.ready()[0] and new.live()[0]
        assert "kubelet v1.36.4 is older than 1.37" in new.ready()[1]
        assert not (plugin_dir / NEW_SOCKET).exists() and len(kubelet.registrations) == 1
        await old.shutdown()
        await until(lambda: len(kubelet.registrations) == 2, timeout=5)
        view = await kubelet.wait_registered(RESOURCE, capacity=2)
        await stays(
            lambda: view.connected and view.allocatable == 2 and new.acting,
            for_=0.3,
            message="view.connected and view.allocatable == 2 and new.acting",
        )
    finally:
        await kubelet.stop()


async def test_a_kubelet_before_1_37_cuts_off_a_pod_registered_beside_the_old_one(
    plugin_dir: Path, start_daemon: DaemonFactory
) -> None:
    """Why auto waits on an older kubelet: there, the old pod's stop takes the new one's registration with it."""
    kubelet = KubeletStandIn(plugin_dir, several_endpoints=False)
    await kubelet.start()
    try:
        old = await start_daemon(pod_uid=OLD)
        await kubelet.wait_registered(RESOURCE, capacity=2)
        await start_daemon(pod_uid=NEW, zero_downtime_upgrade="true")
        await until(lambda: len(kubelet.registrations) == 2)
        await old.shutdown()
        await kubelet.wait_for(lambda: not kubelet.resources[RESOURCE].connected, timeout=5)
    finally:
        await kubelet.stop()


async def test_auto_registers_beside_on_a_kubelet_1_37(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    kube = node_with_kubelet(apiserver, short_dir, "v1.37.2")
    await start_daemon(pod_uid=OLD, kube=kube)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    new = await start_daemon(pod_uid=NEW, kube=kube)
    assert new.serving_wanted and not new.acting
    await until(lambda: len(kubelet.endpoints(RESOURCE)) == 2)


def node_with_kubelet(apiserver: ApiServerStandIn, short_dir: Path, version: str) -> KubeSettings:
    """API access for NODE, whose Node says its kubelet is version."""
    node = apiserver.add_node(NODE)
    node["status"] = {"nodeInfo": {"kubeletVersion": version}}
    apiserver.put("nodes", node)
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig", namespace=NAMESPACE)
    return settings_from({"NODE_NAME": NODE, "POD_NAMESPACE": NAMESPACE}, str(kubeconfig), "test")


async def test_both_pods_advertise_the_xid_the_acting_one_saw_and_the_chip_stays_out_after_the_handover(
    broken_chip: BrokenChip, kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    """XID 64 (it needs an operator) while both pods run: the acting pod sees it (the standby listens for none),
    records it, and the standby advertises it too, so every ListAndWatch message says the same; after the old pod
    stops the chip is still out."""
    settings: dict[str, object] = {**broken_chip.over_double(), "dev_root": short_dir}
    old = await start_daemon(pod_uid=OLD, **settings)
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    new, _ = await start_beside(kubelet, start_daemon, OLD_SOCKET, **settings)
    assert not new.node.monitor.xids_watched
    broken_chip.breaks(1, 64)
    await until(lambda: advertised(old) == advertised(new) == {"GPU-x0": HEALTHY, "GPU-x1": UNHEALTHY}, timeout=5)
    await kubelet.wait_for(lambda: view.devices.get("GPU-x1") == UNHEALTHY)
    await old.shutdown()
    await until(lambda: new.acting and new.node.monitor.xids_watched, timeout=3)
    await stays(
        lambda: advertised(new) == {"GPU-x0": HEALTHY, "GPU-x1": UNHEALTHY},
        for_=0.5,
        message='advertised(new) == {"GPU-x0": HEALTHY, "GPU-x1": UNHEALTHY}',
    )
    assert kubelet.resources[RESOURCE].allocatable == 1
    assert 64 in {c.uuid: c for c in new.inventory.chips()}["GPU-x1"].status.xids  # its own now: it acts for the node


def advertised(daemon: Daemon) -> dict[str, str]:
    return {device.id: HEALTHY if device.healthy else UNHEALTHY for device in daemon.plan.devices}


async def test_a_kubelet_restart_during_the_overlap_has_both_pods_register_again(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    await start_daemon(pod_uid=OLD)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    await start_beside(kubelet, start_daemon, OLD_SOCKET)
    await kubelet.restart()  # wipes both sockets
    await until(lambda: sorted(kubelet.endpoints(RESOURCE)) == sorted([OLD_SOCKET, NEW_SOCKET]))
    await kubelet.wait_registered(RESOURCE, capacity=2)


async def test_the_socket_of_a_pod_that_was_killed_is_removed_by_the_next_pod(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, plugin_dir: Path
) -> None:
    dead = plugin_dir / OLD_SOCKET
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(dead))  # bound, never served again: what kill -9 leaves
    await start_daemon(pod_uid=NEW)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    assert not dead.exists() and (plugin_dir / NEW_SOCKET).is_socket()


async def test_during_the_overlap_the_acting_pod_alone_resets_and_the_standby_refuses_the_chip_meanwhile(
    broken_chip: BrokenChip,
    ixsmi: Ixsmi,
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    pod_resources: PodResourcesStandIn,
    short_dir: Path,
) -> None:
    """The standby answers every Allocate during the overlap: it reads the record, which says a reservation before
    any ListAndWatch does, so it never hands out the chip the acting pod is resetting; it resets nothing itself."""
    settings: dict[str, object] = {
        **broken_chip.over_double(),
        "dev_root": short_dir,
        "given": config_flags(self_healing="true"),
        "pod_resources_socket": pod_resources.socket_path,
    }
    old = await start_daemon(pod_uid=OLD, **settings)
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    new, _ = await start_beside(kubelet, start_daemon, OLD_SOCKET, **settings)
    request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-x1"])])
    assert await new._before_allocate(new.plan, request) is None  # free: nothing to do
    ixsmi.delay.write_text("2")
    broken_chip.breaks(1, 48)
    await until(lambda: "GPU-x1" in old.node.healing.healer.reserved, timeout=5)
    with pytest.raises(AllocationError, match="held out of service for a reset"):
        await new._before_allocate(new.plan, request)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=10)
    await until(lambda: advertised(new) == {"GPU-x0": HEALTHY, "GPU-x1": HEALTHY})
    assert ixsmi.runs() == ["-r -i GPU-x1"]  # once, by the acting pod
    assert await new._before_allocate(new.plan, request) is None


async def test_the_first_update_from_a_release_without_the_role_waits_for_it_on_a_kubelet_before_1_37(
    plugin_dir: Path, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    """The pod of an earlier release serves iluvatar-gpu.sock and holds no role: the new pod takes the role at once,
    yet it must not register beside that pod on an older kubelet, whose stop would cut the new one off."""
    kubelet = KubeletStandIn(plugin_dir, several_endpoints=False)
    await kubelet.start()
    try:
        earlier = await start_daemon(kubelet_plugins_directory_path=None)  # the fixed name, no role
        await kubelet.wait_registered(RESOURCE, capacity=2)
        new = await start_daemon(pod_uid=NEW, kube=node_with_kubelet(apiserver, short_dir, "v1.36.4"))
        assert new.acting and not new.serving_wanted
        assert f"another plugin serves {plugin_dir / 'iluvatar-gpu.sock'}" in new.ready()[1]
        assert len(kubelet.registrations) == 1
        await earlier.shutdown()
        await until(lambda: len(kubelet.registrations) == 2, timeout=5)
        view = await kubelet.wait_registered(RESOURCE, capacity=2)
        await stays(
            lambda: view.connected and view.allocatable == 2,
            for_=0.3,
            message="view.connected and view.allocatable == 2",
        )
    finally:
        await kubelet.stop()


async def test_the_first_update_from_a_release_without_the_role_registers_beside_it_on_a_kubelet_1_37(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    earlier = await start_daemon(kubelet_plugins_directory_path=None)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    new, allocatable = await start_beside(kubelet, start_daemon, "iluvatar-gpu.sock")
    await earlier.shutdown()
    await until(lambda: kubelet.endpoints(RESOURCE) == [NEW_SOCKET])
    assert new.acting and set(allocatable.seen) == {2}
