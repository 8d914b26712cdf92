"""The plugin and a kubelet stand-in over real gRPC on real unix sockets."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from helpers.support import RESOURCE, DaemonFactory, config_flags

from ix_device_plugin.api import HEALTHY, UNHEALTHY, api_pb2
from ix_device_plugin.standins.kubelet import KubeletStandIn

BOARDS_YAML = """
boards:
  - product: BI-V150
    chips:
      - {numa_node: 0}
      - {numa_node: 0}
  - product: BI-V150
    chips:
      - {numa_node: 1}
      - {numa_node: 1, health: {health}}
"""


async def test_register_list_prefer_allocate(kubelet: KubeletStandIn, start_daemon: DaemonFactory) -> None:
    daemon = await start_daemon("BI-V150:2")
    view = await kubelet.wait_registered(RESOURCE)
    request = kubelet.registrations[-1]
    assert (request.version, request.endpoint, request.resource_name) == ("v1beta1", "iluvatar-gpu.sock", RESOURCE)
    assert request.options.get_preferred_allocation_available
    assert view.options.get_preferred_allocation_available and not view.options.pre_start_required
    assert view.capacity == 2 and view.allocatable == 2
    board = daemon.plan.devices[0]
    chosen = await kubelet.preferred(RESOURCE, list(view.devices), [], 1)
    assert chosen == [board.id]
    response = await kubelet.allocate(RESOURCE, [chosen])
    (container,) = response.container_responses
    assert [(d.host_path, d.container_path, d.permissions) for d in container.devices] == [
        ("/dev/iluvatar0", "/dev/iluvatar0", "rw"),
        ("/dev/iluvatar1", "/dev/iluvatar1", "rw"),
    ]
    assert container.envs["IX_VISIBLE_DEVICES"] == ",".join(c.uuid for c in board.chips)
    assert container.envs["ILUVATAR_COREX_REPLICA_DEVICES"] == board.id


@pytest.mark.parametrize(
    ("devices", "flags", "capacity"),
    [
        ("BI-V150:2", {}, 2),
        ("BI-V150:2", {"splitboard": "true"}, 4),
        ("BI-V150:2", {"replicas": "4"}, 8),
        ("BI-V150:2", {"replicas": "4", "splitboard": "true"}, 16),
        ("BI-V100:2", {"replicas": "4"}, 8),
    ],
)
async def test_capacity_seen_by_kubelet(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, devices: str, flags: dict[str, str], capacity: int
) -> None:
    await start_daemon(devices, given=config_flags(**flags))
    view = await kubelet.wait_registered(RESOURCE)
    assert view.capacity == capacity


async def test_two_chips_of_split_boards_on_a_partly_used_node_are_one_whole_board(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    daemon = await start_daemon("BI-V150:3", given=config_flags(splitboard="true"))
    view = await kubelet.wait_registered(RESOURCE)
    a0, a1, b0, b1, c0, c1 = (device.id for device in daemon.plan.devices)
    assert set(view.devices) == {a0, a1, b0, b1, c0, c1}
    # a0 is in use; the kubelet offers the rest in its own order, the half-used board's chip first.
    assert await kubelet.preferred(RESOURCE, [a1, b0, c1, b1, c0], [], 2) == [b0, b1]
    assert await kubelet.preferred(RESOURCE, [a1, c1, b0, c0], [], 2) == [c0, c1]


async def test_topology_reaches_the_kubelet(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    devices = short_dir / "devices.yaml"
    devices.write_text(BOARDS_YAML.replace("{health}", "[]"))
    await start_daemon(str(devices))
    view = await kubelet.wait_registered(RESOURCE)
    assert sorted(view.numa.values()) == [(0,), (1,)]


async def test_health_flips_through_the_file_and_recover(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path
) -> None:
    devices = short_dir / "devices.yaml"
    devices.write_text(BOARDS_YAML.replace("{health}", "[]"))
    daemon = await start_daemon(str(devices), health_interval=0.1)
    view = await kubelet.wait_registered(RESOURCE)
    second = daemon.plan.devices[1].id
    assert view.devices[second] == HEALTHY
    devices.write_text(BOARDS_YAML.replace("{health}", "[ECC, OverTemp]"))
    await kubelet.wait_for(lambda: view.devices[second] == UNHEALTHY, timeout=3)
    assert view.capacity == 2 and view.allocatable == 1
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await kubelet.allocate(RESOURCE, [[second]])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "ECC" in caught.value.details() and "OverTemp" in caught.value.details()
    devices.write_text(BOARDS_YAML.replace("{health}", "[]"))
    await kubelet.wait_for(lambda: view.devices[second] == HEALTHY, timeout=3)


async def test_chip_falling_off_the_bus(kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path) -> None:
    devices = short_dir / "devices.yaml"
    devices.write_text(BOARDS_YAML.replace("{health}", "[]"))
    daemon = await start_daemon(str(devices), health_interval=0.1, given=config_flags(splitboard="true"))
    view = await kubelet.wait_registered(RESOURCE, capacity=4)
    last = daemon.plan.devices[3].id
    devices.write_text(
        BOARDS_YAML.replace("{health}", "[]").replace("{numa_node: 1}\n", "{numa_node: 1, present: false}\n", 1)
    )
    third = daemon.plan.devices[2].id
    await kubelet.wait_for(lambda: view.devices.get(third) == UNHEALTHY, timeout=3)
    assert view.devices[last] == HEALTHY


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([["GPU-unknown"]], "container request 0: unknown device ID 'GPU-unknown'"),
        ([[]], "container request 0: no device IDs given"),
        ([], "allocate request has no container requests"),
        ([["{0}"], ["{0}", "{0}"]], "container request 1: device ID '{0}' requested twice"),
        ([["{0}"], ["bad\x00id"]], "container request 1: unknown device ID"),
    ],
)
async def test_bad_allocate_requests_get_invalid_argument(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, requests: list[list[str]], message: str
) -> None:
    daemon = await start_daemon("BI-V100:2")
    await kubelet.wait_registered(RESOURCE)
    first = daemon.plan.devices[0].id
    filled = [[item.format(first) for item in ids] for ids in requests]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await kubelet.allocate(RESOURCE, filled)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message.format(first) in caught.value.details()
    # Still serving after a refusal.
    ok = await kubelet.allocate(RESOURCE, [[first]])
    assert ok.container_responses[0].envs["IX_REPLICA_DEVICES"] == first


async def test_bad_preferred_requests(kubelet: KubeletStandIn, start_daemon: DaemonFactory) -> None:
    daemon = await start_daemon("BI-V100:2")
    await kubelet.wait_registered(RESOURCE)
    ids = [d.id for d in daemon.plan.devices]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await kubelet.preferred(RESOURCE, ids, [], 3)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "allocation_size 3 is larger than the 2 available" in caught.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await kubelet.preferred(RESOURCE, ids[:1], ids[1:], 1)
    assert "is not in available_deviceIDs" in caught.value.details()


async def test_prestart_is_a_noop(kubelet: KubeletStandIn, start_daemon: DaemonFactory) -> None:
    daemon = await start_daemon("BI-V100:1")
    await kubelet.wait_registered(RESOURCE)
    stub = kubelet._stub(RESOURCE)
    response = await stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=[daemon.plan.devices[0].id]))
    assert response == api_pb2.PreStartContainerResponse()


async def test_many_containers_in_one_request(kubelet: KubeletStandIn, start_daemon: DaemonFactory) -> None:
    daemon = await start_daemon("BI-V150:1", given=config_flags(replicas="2"))
    await kubelet.wait_registered(RESOURCE)
    ids = [d.id for d in daemon.plan.devices]
    response = await kubelet.allocate(RESOURCE, [[ids[0]], [ids[1]]])
    assert [c.envs["IX_REPLICA_DEVICES"] for c in response.container_responses] == ids
