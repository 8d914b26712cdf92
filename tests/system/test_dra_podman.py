"""A real CDI consumer for DRA: podman starts containers with the CDI IDs NodePrepareResources answered.

The GPU nodes are stand-ins (character devices with /dev/null's numbers) under the node's dev root.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.container_support import IMAGE, PodmanSandbox, make_char_device, podman_sandbox
from helpers.dra_support import DraNode

from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.apiserver import ApiServerStandIn


@pytest.fixture(scope="module")
def podman() -> Iterator[PodmanSandbox]:
    with podman_sandbox("ix-dra-podman-") as sandbox:
        yield sandbox


@pytest.fixture
async def node(short_dir: Path, podman: PodmanSandbox) -> AsyncIterator[DraNode]:
    for name in ("iluvatar0", "iluvatar1", "iluvatar2", "iluvatar3", "itrctl"):
        make_char_device(short_dir / "dev" / name)
    for spec in podman.cdi_dir.glob(cdi_spec_file("*")):
        spec.unlink()  # a fresh node: the claim specs of the previous test's node would be claims held here
    async with ApiServerStandIn() as api:
        dra_node = DraNode(short_dir, api)
        dra_node.cdi_dir = podman.cdi_dir
        yield dra_node
        await dra_node.stop_all()


def container_view(podman: PodmanSandbox, cdi_ids: list[str]) -> tuple[set[str], str]:
    """(GPU nodes and itrctl in /dev, IX_VISIBLE_DEVICES) of a container given cdi_ids."""
    seen, env = container_env(podman, cdi_ids)
    return seen, env["VISIBLE"]


def container_env(podman: PodmanSandbox, cdi_ids: list[str]) -> tuple[set[str], dict[str, str]]:
    """(GPU nodes and itrctl in /dev, IX_VISIBLE_DEVICES and IX_REPLICA_DEVICES) of a container given cdi_ids."""
    devices = [f"--device={cdi_id}" for cdi_id in cdi_ids]
    script = "ls /dev; echo VISIBLE=$IX_VISIBLE_DEVICES; echo REPLICA=$IX_REPLICA_DEVICES"
    result = podman.run(*devices, IMAGE, "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    env = dict(line.partition("=")[::2] for line in lines if line.startswith(("VISIBLE=", "REPLICA=")))
    return {name for name in lines if name.startswith(("iluvatar", "itrctl"))}, env


def cdi_ids_of(answer: Any) -> list[str]:
    return [cdi_id for device in answer.devices for cdi_id in device.cdi_device_ids]


@pytest.mark.parametrize(
    ("devices", "nodes"),
    [(["gpu-1"], {"iluvatar1"}), (["gpu-2", "gpu-3"], {"iluvatar2", "iluvatar3"})],
    ids=["one-chip", "whole-board"],
)
async def test_a_prepared_claim_reaches_the_container_as_its_device_nodes(
    node: DraNode, podman: PodmanSandbox, devices: list[str], nodes: set[str]
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda listed: len(listed) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("claim", devices)
    result = (await kubelet.prepare([claim])).claims[claim[2]]
    assert result.error == ""
    cdi_ids = [cdi_id for device in result.devices for cdi_id in device.cdi_device_ids]
    seen, visible = container_view(podman, cdi_ids)
    assert seen == {*nodes, "itrctl"}
    uuids = {
        name: d["attributes"]["uuid"]["string"]
        for name, d in node.slice_devices().items()
        if d["attributes"]["type"] == {"string": "chip"}
    }
    assert visible == ",".join(uuids[name] for name in devices)
    await kubelet.unprepare([claim])
    refused = podman.run(*[f"--device={cdi_id}" for cdi_id in cdi_ids], IMAGE, "ls", "/dev")
    assert refused.returncode != 0  # unprepared: the runtime no longer knows the claim's devices
    await kubelet.close()


async def test_a_board_claim_and_a_chip_claim_from_one_slice_reach_their_containers(
    node: DraNode, podman: PodmanSandbox
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda listed: len(listed) == 6)
    kubelet = await node.kubelet(driver)
    board, chip = node.claim("board", ["board-0"]), node.claim("chip", ["gpu-3"])
    response = await kubelet.prepare([board, chip])
    uuids = {name: device.chip.uuid for name, device in driver.content.by_name().items() if name.startswith("gpu")}
    seen, visible = container_view(podman, cdi_ids_of(response.claims[board[2]]))
    assert (seen, visible) == ({"iluvatar0", "iluvatar1", "itrctl"}, f"{uuids['gpu-0']},{uuids['gpu-1']}")
    seen, visible = container_view(podman, cdi_ids_of(response.claims[chip[2]]))
    assert (seen, visible) == ({"iluvatar3", "itrctl"}, uuids["gpu-3"])
    await kubelet.close()


async def test_four_shares_of_one_chip_each_see_the_chip_and_unpreparing_one_leaves_three(
    node: DraNode, podman: PodmanSandbox
) -> None:
    driver = await node.start(config=Config(splitboard=True, replicas=4))
    await node.wait_slice(lambda listed: len(listed) == 4)
    kubelet = await node.kubelet(driver)
    shares = [node.claim(f"share-{i}", ["gpu-2"], shares=1) for i in range(4)]
    response = await kubelet.prepare(shares)
    uuid = driver.content.by_name()["gpu-2"].chip.uuid
    replicas = set()
    for claim in shares:
        seen, env = container_env(podman, cdi_ids_of(response.claims[claim[2]]))
        assert (seen, env["VISIBLE"]) == ({"iluvatar2", "itrctl"}, uuid)
        replicas.add(env["REPLICA"])
    assert replicas == {f"{uuid}::{slot}" for slot in range(4)}  # each container names its own share
    await kubelet.unprepare([shares[0]])
    gone = podman.run(*[f"--device={i}" for i in cdi_ids_of(response.claims[shares[0][2]])], IMAGE, "true")
    assert gone.returncode != 0
    for claim in shares[1:]:
        assert container_env(podman, cdi_ids_of(response.claims[claim[2]]))[0] == {"iluvatar2", "itrctl"}
    await kubelet.close()


async def test_two_pods_sharing_a_claim_get_the_same_chip(node: DraNode, podman: PodmanSandbox) -> None:
    driver = await node.start()
    await node.wait_slice(lambda listed: len(listed) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("shared", ["gpu-0"])
    first = (await kubelet.prepare([claim])).claims[claim[2]]
    second = (await kubelet.prepare([claim])).claims[claim[2]]
    views = [
        container_view(podman, [i for d in answer.devices for i in d.cdi_device_ids]) for answer in (first, second)
    ]
    assert views[0] == views[1]
    assert views[0][0] == {"iluvatar0", "itrctl"}
    await kubelet.close()


async def test_after_a_reboot_the_prepared_claim_runs_in_a_container_again(
    node: DraNode, podman: PodmanSandbox
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda listed: len(listed) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("survivor", ["gpu-3"])
    before = (await kubelet.prepare([claim])).claims[claim[2]]
    await kubelet.close()
    await node.stop(driver)
    node.reboot()  # the CDI directory is a tmpfs: empty after a reboot; the checkpoint is kept
    restarted = await node.start()
    kubelet = await node.kubelet(restarted)
    after = (await kubelet.prepare([claim])).claims[claim[2]]  # the kubelet prepares again after a reboot
    assert after == before
    seen, _ = container_view(podman, [i for d in after.devices for i in d.cdi_device_ids])
    assert seen == {"iluvatar3", "itrctl"}  # without the spec written again: "unresolvable CDI devices"
    await kubelet.close()
