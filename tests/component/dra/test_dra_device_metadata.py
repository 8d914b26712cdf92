"""Device metadata through the driver (real gRPC, real files): written at prepare with the attributes the slice
publishes, the same bytes after a restart and a reboot, the next generation when a chip's health changes, gone at
unprepare; during an update the pod on standby leaves the files alone, and the new publisher writes what it
publishes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from dra_support import DraNode, answer

from ix_device_plugin.dra.metadata import generation_of, host_path
from ix_device_plugin.dra.prepared import ClaimRef
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.settings.config import Config


def metadata_file(node: DraNode, claim: tuple[str, str, str], request: str = "gpu") -> Path:
    return host_path(node.root / "plugins" / DRIVER, ClaimRef(*claim), request)


def devices_of(path: Path) -> list[dict[str, Any]]:
    first, _ = json.JSONDecoder().raw_decode(path.read_text())
    return [device for request in first["requests"] for device in request["devices"]]


async def wait_generation(path: Path, generation: int, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while generation_of(path.read_text()) != generation:
            await asyncio.sleep(0.05)


async def test_metadata_follows_a_claim_from_prepare_through_restart_health_and_unprepare(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("one-gpu", ["gpu-1"])
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    path = metadata_file(node, claim)
    (device,) = devices_of(path)
    published = node.slice_devices()["gpu-1"]["attributes"]
    assert {key: device["attributes"][key] for key in published} == published
    assert device["attributes"]["healthy"] == {"bool": True}
    spec = node.cdi_dir / f"{DRIVER}_metadata_{claim[2]}_gpu.json"
    assert json.loads(spec.read_text())["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] == str(path)
    written = path.read_text()

    await node.stop(driver)
    node.reboot()  # the CDI directory empties; the metadata lives beside the checkpoint
    driver = await node.start()
    kubelet = await node.kubelet(driver)
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""  # the kubelet prepares again
    await asyncio.sleep(1.5)  # the publisher's pod has compared what it says with what the node says now
    assert path.read_text() == written and spec.is_file()

    node.write_boards([{"product": "BI-V150", "chips": [None, {"health": ["ECC"]}]}, {"product": "BI-V150"}])
    await wait_generation(path, 2)
    assert devices_of(path)[0]["attributes"]["healthy"] == {"bool": False}

    assert answer(await kubelet.unprepare([claim]), claim[2]).error == ""
    assert not path.exists() and not path.parent.parent.exists() and not spec.exists()


async def test_during_an_update_the_standby_leaves_the_files_and_the_new_publisher_writes_what_it_publishes(
    node: DraNode,
) -> None:
    old = await node.start(pod_uid="pod-old")
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(old)
    claim = node.claim("one-gpu", ["gpu-1"])
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    path = metadata_file(node, claim)
    assert devices_of(path)[0]["attributes"]["extendedResource"] == {"bool": False}
    new = await node.start(pod_uid="pod-new", config=Config(splitboard=True))  # one iluvatar.com/gpu: a chip
    await asyncio.sleep(1.5)  # the standby publishes nothing, and writes no metadata
    assert not new.role.held and generation_of(path.read_text()) == 1
    await node.stop(old)
    await wait_generation(path, 2)
    chip_per_gpu = {"bool": True}
    await node.wait_slice(lambda devices: devices["gpu-1"]["attributes"]["extendedResource"] == chip_per_gpu)
    published, attributes = node.slice_devices()["gpu-1"]["attributes"], devices_of(path)[0]["attributes"]
    assert {key: attributes[key] for key in published} == published
    await kubelet.close()
