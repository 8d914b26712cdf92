"""The kubelet stand-in against the IXML backend over the compiled libixml.so double.

For the same devices, `--backend ixml` must tell the kubelet exactly what `--backend simulated` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.support import RESOURCE, DaemonFactory, config_flags

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.hardware.ixml import IxmlBackend
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.standins.kubelet import KubeletStandIn

CHIPS = [  # uuid, minor, bus, numa, board
    ("GPU-b0-c0", 0, "8A", 0, "B0"),
    ("GPU-b0-c1", 1, "8B", 0, "B0"),
    ("GPU-b1-c0", 2, "CA", 1, "B1"),
    ("GPU-b1-c1", 3, "CB", 1, "B1"),
]


def double_config(sick: str = "") -> str:
    lines = ["driver=4.1.0"]
    for uuid, minor, bus, _, board in CHIPS:
        health = "0x10" if uuid == sick else "0x0"
        lines.append(
            f'device uuid={uuid} name="Iluvatar BI-V150" minor={minor} bus=00000000:{bus}:00.0 '
            f"memory=32768 board={board} position={minor % 2} health={health}"
        )
    return "\n".join(lines) + "\n"


def simulated_yaml(sick: str = "") -> str:
    lines = ["boards:"]
    for uuid, minor, bus, numa, _ in CHIPS:
        if minor % 2 == 0:
            lines += ["  - product: BI-V150", "    chips:"]
        health = "[ECC]" if uuid == sick else "[]"
        lines.append(
            f'      - {{uuid: {uuid}, minor: {minor}, bus_id: "0000:{bus.lower()}:00.0", numa_node: {numa}, '
            f"health: {health}}}"
        )
    return "\n".join(lines) + "\n"


@pytest.fixture
def host(short_dir: Path) -> tuple[Path, Path]:
    """A dev root with the chips' nodes and /dev/itrctl, and a sysfs with their NUMA nodes."""
    dev = short_dir / "dev"
    dev.mkdir()
    for _, minor, bus, numa, _ in CHIPS:
        (dev / f"iluvatar{minor}").touch()
        pci = short_dir / "sys" / "bus" / "pci" / "devices" / f"0000:{bus.lower()}:00.0"
        pci.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{numa}\n")
    (dev / "itrctl").touch()
    return short_dir, short_dir / "sys"


@dataclass
class IxmlNode:
    """The double's device file (write it to change what the library reports) and a backend factory."""

    conf: Path
    dev_root: Path
    factory: Callable[[], IxmlBackend]


@pytest.fixture
def ixml(libs: dict[str, Path], host: tuple[Path, Path], short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> IxmlNode:
    dev_root, sysfs = host
    conf = short_dir / "double.conf"
    monkeypatch.setenv("IXML_DOUBLE_CONFIG", str(conf))
    return IxmlNode(conf, dev_root, lambda: IxmlBackend(str(libs["full"]), dev_root=dev_root, sysfs_root=sysfs))


async def kubelet_sees(kubelet: KubeletStandIn, resource: str, capacity: int) -> dict[str, Any]:
    view = await kubelet.wait_registered(resource, capacity=capacity)
    allocations = {}
    for device_id, health in view.devices.items():
        if health == HEALTHY:
            container = (await kubelet.allocate(resource, [[device_id]])).container_responses[0]
            allocations[device_id] = (
                [(d.host_path, d.container_path, d.permissions) for d in container.devices],
                dict(container.envs),
            )
    return {"devices": dict(view.devices), "numa": dict(view.numa), "allocations": allocations}


@pytest.mark.parametrize(
    ("flags", "capacity"),
    [({}, 2), ({"splitboard": "true"}, 4), ({"replicas": "4"}, 8), ({"splitboard": "true", "replicas": "2"}, 8)],
)
async def test_ixml_and_simulated_tell_the_kubelet_the_same(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    ixml: IxmlNode,
    flags: dict[str, str],
    capacity: int,
) -> None:
    ixml.conf.write_text(double_config(sick="GPU-b1-c1"))
    daemon = await start_daemon(backend_factory=ixml.factory, given=config_flags(**flags))
    seen_ixml = await kubelet_sees(kubelet, RESOURCE, capacity)
    await daemon.shutdown()
    await kubelet.wait_for(lambda: not kubelet.resources[RESOURCE].connected)

    devices = ixml.conf.parent / "devices.yaml"
    devices.write_text(simulated_yaml(sick="GPU-b1-c1"))
    await start_daemon(str(devices), given=config_flags(**flags))
    seen_simulated = await kubelet_sees(kubelet, RESOURCE, capacity)

    assert seen_ixml == seen_simulated
    assert UNHEALTHY in seen_ixml["devices"].values()
    first = next(iter(seen_ixml["allocations"].values()))
    assert ("/dev/itrctl", "/dev/itrctl", "rw") in first[0]


async def test_ixml_health_flips_reach_the_kubelet(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    ixml: IxmlNode,
) -> None:
    ixml.conf.write_text(double_config())
    await start_daemon(
        backend_factory=ixml.factory,
        given=config_flags(splitboard="true"),
        health_interval=0.1,
    )
    view = await kubelet.wait_registered(RESOURCE, capacity=4)
    assert set(view.devices.values()) == {HEALTHY}
    ixml.conf.write_text(double_config(sick="GPU-b0-c1"))
    await kubelet.wait_for(lambda: view.devices["GPU-b0-c1"] == UNHEALTHY, timeout=3)
    (ixml.dev_root / "dev" / "iluvatar2").unlink()
    await kubelet.wait_for(lambda: view.devices["GPU-b1-c0"] == UNHEALTHY, timeout=3)
    ixml.conf.write_text(double_config())
    (ixml.dev_root / "dev" / "iluvatar2").touch()
    await kubelet.wait_for(lambda: set(view.devices.values()) == {HEALTHY}, timeout=3)


async def test_a_driver_without_board_positions_advertises_every_chip_healthy(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    ixml: IxmlNode,
    libs: dict[str, Path],
    host: tuple[Path, Path],
) -> None:
    ixml.conf.write_text(double_config())
    dev_root, sysfs = host
    await start_daemon(backend_factory=lambda: IxmlBackend(str(libs["old"]), dev_root=dev_root, sysfs_root=sysfs))
    view = await kubelet.wait_registered(RESOURCE, capacity=4)
    assert view.devices == dict.fromkeys(("GPU-b0-c0", "GPU-b0-c1", "GPU-b1-c0", "GPU-b1-c1"), HEALTHY)
    (container,) = (await kubelet.allocate(RESOURCE, [["GPU-b0-c1"]])).container_responses
    assert [d.host_path for d in container.devices] == ["/dev/iluvatar1", "/dev/itrctl"]


async def test_ixml_init_failure_with_fail_on_init_error_false(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    ixml: IxmlNode,
) -> None:
    ixml.conf.write_text("fail_init=1\n")
    await start_daemon(
        backend_factory=ixml.factory,
        given=config_flags(fail_on_init_error="false"),
        rediscover_interval=0.3,
    )
    view = await kubelet.wait_registered(RESOURCE)
    assert view.capacity == 0
    ixml.conf.write_text(double_config())
    await kubelet.wait_registered(RESOURCE, capacity=2, timeout=5)


async def test_ixml_init_failure_exits_by_default(
    start_daemon: DaemonFactory,
    ixml: IxmlNode,
) -> None:
    ixml.conf.write_text("fail_init=1\n")
    with pytest.raises(StartupError, match="failOnInitError"):
        await start_daemon(backend_factory=ixml.factory)
