"""A real CDI consumer: podman reads the spec CdiSpecWriter writes and gives containers exactly those nodes.

The GPU nodes are stand-ins (character devices with /dev/null's numbers) under a temporary dev root, so the
spec uses `hostPath`; the container sees them at their real names.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.container_support import IMAGE, PodmanSandbox, make_char_device, podman_sandbox

from ix_device_plugin.core.cdi import qualified_name, qualified_names
from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.deviceplugin.outputs import CdiSpecWriter
from ix_device_plugin.hardware.simulated import parse_spec

GPU_NODES = ("iluvatar0", "iluvatar1", "iluvatar2", "iluvatar3")


class Node:
    """A host with two BI-V150 boards: fake device nodes, the written spec and a podman sandbox."""

    def __init__(self, directory: Path, podman: PodmanSandbox) -> None:
        self.dev_root = directory / "host"
        for name in (*GPU_NODES, "itrctl"):
            make_char_device(self.dev_root / "dev" / name)
        self.inventory = Inventory(boards=parse_spec("BI-V150:2"), control_nodes=("/dev/itrctl",))
        self.uuids = [chip.uuid for chip in self.inventory.chips()]
        self.podman = podman
        assert CdiSpecWriter(self.podman.cdi_dir, self.dev_root).apply(self.inventory)

    def dev_listing(self, *devices: str) -> set[str]:
        """The names in /dev of a container given devices (CDI names)."""
        arguments = [f"--device={device}" for device in devices]
        result = self.podman.run(*arguments, IMAGE, "ls", "/dev")
        assert result.returncode == 0, result.stderr
        return set(result.stdout.split())


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with podman_sandbox("ix-cdi-podman-") as podman:
        yield Node(podman.directory, podman)


def gpu_nodes(listing: set[str]) -> set[str]:
    return {name for name in listing if name.startswith("iluvatar")}


def test_one_chip_gives_its_node_and_itrctl(node: Node) -> None:
    listing = node.dev_listing(qualified_name(node.uuids[1]))
    assert gpu_nodes(listing) == {"iluvatar1"}
    assert "itrctl" in listing


def test_two_chips_give_both_and_no_other(node: Node) -> None:
    listing = node.dev_listing(*qualified_names([node.uuids[0], node.uuids[3]]))
    assert gpu_nodes(listing) == {"iluvatar0", "iluvatar3"}
    assert "itrctl" in listing


def test_all_gives_every_chip(node: Node) -> None:
    listing = node.dev_listing(qualified_name("all"))
    assert gpu_nodes(listing) == set(GPU_NODES)
    assert "itrctl" in listing


def test_no_cdi_device_gives_no_gpu_node(node: Node) -> None:
    result = node.podman.run(IMAGE, "ls", "/dev")
    assert result.returncode == 0, result.stderr
    listing = set(result.stdout.split())
    assert gpu_nodes(listing) == set()
    assert "itrctl" not in listing


def test_unknown_cdi_device_is_refused(node: Node) -> None:
    result = node.podman.run(f"--device={qualified_name('GPU-not-on-this-node')}", IMAGE, "ls", "/dev")
    assert result.returncode != 0
    assert "GPU-not-on-this-node" in result.stderr


async def test_a_container_started_with_the_names_allocate_returned_sees_exactly_those_nodes(
    node: Node, kubelet, start_daemon
) -> None:
    """The daemon writes the spec, the kubelet asks for one GPU, the runtime injects what Allocate named."""
    from helpers.support import RESOURCE, config_flags

    daemon = await start_daemon(
        "BI-V150:2",
        cdi_spec_dir=node.podman.cdi_dir,
        dev_root=node.dev_root,
        given=config_flags(device_list_strategy="cdi-cri"),
    )
    await kubelet.wait_registered(RESOURCE, capacity=2)
    container = await kubelet.admit(RESOURCE, 1)
    names = [device.name for device in container.cdi_devices]
    assert list(container.devices) == []  # cdi-cri: the runtime, not the kubelet, adds the nodes
    board = next(d for d in daemon.plan.devices if container.envs["IX_VISIBLE_DEVICES"].startswith(d.chips[0].uuid))
    assert names == [f"iluvatar.com/gpu={chip.uuid}" for chip in board.chips]
    listing = node.dev_listing(*names)
    assert gpu_nodes(listing) == {f"iluvatar{chip.minor}" for chip in board.chips}
    assert "itrctl" in listing
