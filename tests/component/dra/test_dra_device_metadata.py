"""Device metadata through the driver (real gRPC, real files): written at prepare with the attributes the slice
publishes, the same bytes after a restart and a reboot, the next generation when a chip's health changes, gone at
unprepare; during an update the pod on standby leaves the files alone, and the new publisher writes what it
publishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.dra_support import DraNode, answer
from helpers.waits import stays, until

from ix_device_plugin.dra.metadata import generation_of, host_path
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.settings.config import Config


def metadata_file(node: DraNode, claim: tuple[str, str, str], request: str = "gpu") -> Path:
    return host_path(node.root / "plugins" / DRIVER, claim[2], request)


def devices_of(path: Path) -> list[dict[str, Any]]:
    first, _ = json.JSONDecoder().raw_decode(path.read_text())
    return [device for request in first["requests"] for device in request["devices"]]


async def wait_generation(path: Path, generation: int, timeout: float = 10.0) -> None:
    await until(lambda: generation_of(path.read_text()) == generation, timeout=timeout, interval=0.05)


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
    await stays(
        lambda: path.read_text() == written and spec.is_file(),
        for_=1.5,
        message="the publisher's pod has compared what it says with what the node says now",
    )

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
    await stays(
        lambda: not new.node.role.held and generation_of(path.read_text()) == 1,
        for_=1.5,
        message="the standby publishes nothing, and writes no metadata",
    )
    await node.stop(old)
    await wait_generation(path, 2)
    chip_per_gpu = {"bool": True}
    await node.wait_slice(lambda devices: devices["gpu-1"]["attributes"]["extendedResource"] == chip_per_gpu)
    published, attributes = node.slice_devices()["gpu-1"]["attributes"], devices_of(path)[0]["attributes"]
    assert {key: attributes[key] for key in published} == published
    await kubelet.close()


def mounted_file(node: DraNode, claim: tuple[str, str, str], request: str = "gpu") -> Path:
    """The host file the claim's metadata CDI spec bind-mounts into its containers."""
    spec = json.loads((node.cdi_dir / f"{DRIVER}_metadata_{claim[2]}_{request}.json").read_text())
    return Path(spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"])


def claim_of(path: Path) -> tuple[str, list[str]]:
    """The claim UID a metadata file names, and its devices."""
    first, _ = json.JSONDecoder().raw_decode(path.read_text())
    return first["metadata"]["uid"], [device["name"] for device in devices_of(path)]


async def test_a_claim_made_again_with_the_same_name_has_its_own_file_and_the_old_ones_unprepare_leaves_it(
    node: DraNode,
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    old = node.claim("work", ["gpu-1"])
    assert answer(await kubelet.prepare([old]), old[2]).error == ""
    old_file = mounted_file(node, old)
    inode = old_file.stat().st_ino
    await kubelet.close()
    await node.stop(driver)  # the old claim is deleted and made again meanwhile: its unprepare is pending
    new = node.claim("work", ["gpu-2"])
    driver = await node.start()
    kubelet = await node.kubelet(driver)
    assert answer(await kubelet.prepare([new]), new[2]).error == ""
    new_file = mounted_file(node, new)
    assert new_file != old_file
    assert claim_of(old_file) == (old[2], ["gpu-1"]) and old_file.stat().st_ino == inode  # the old mounts say so
    assert claim_of(new_file) == (new[2], ["gpu-2"])

    assert answer(await kubelet.unprepare([old]), old[2]).error == ""
    assert not old_file.exists()
    assert claim_of(new_file) == (new[2], ["gpu-2"])  # the new claim's next container start finds its file
    assert answer(await kubelet.unprepare([new]), new[2]).error == ""
    assert not new_file.exists()
    await kubelet.close()


async def test_a_claim_whose_namespace_and_name_are_as_long_as_kubernetes_allows_is_prepared(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    name = ".".join(["n" * 63] * 3) + "." + "n" * 61  # 253 bytes, the most a name may have
    claim = node.claim(name, ["gpu-1"], namespace="s" * 63)
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    assert claim_of(mounted_file(node, claim)) == (claim[2], ["gpu-1"])
    assert answer(await kubelet.unprepare([claim]), claim[2]).error == ""
    assert not list((node.root / "plugins" / DRIVER / "dra-device-metadata").iterdir())
    await kubelet.close()


async def test_a_file_found_torn_after_a_restart_gets_a_generation_never_used_before(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("one-gpu", ["gpu-1"])
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    path = mounted_file(node, claim)
    node.write_boards([{"product": "BI-V150", "chips": [None, {"health": ["ECC"]}]}, {"product": "BI-V150"}])
    await wait_generation(path, 2)
    await kubelet.close()
    await node.stop(driver)
    whole = path.read_text()
    with path.open("r+") as torn:  # a write cut short: the file keeps its inode and a part of its text
        torn.truncate(len(whole) // 3)

    driver = await node.start()
    await wait_generation(path, 3)  # not 1 again: what a reader saw of generation 2 is not said again
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150"}])
    await wait_generation(path, 4)
    assert devices_of(path)[0]["attributes"]["healthy"] == {"bool": True}


async def test_an_update_from_files_by_name_keeps_the_file_running_containers_mount(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("one-gpu", ["gpu-1"])
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await kubelet.close()
    await node.stop(driver)
    by_uid = mounted_file(node, claim)
    by_name = by_uid.parent.parent.parent / f"{claim[0]}_{claim[1]}" / "gpu" / "metadata.json"
    by_uid.parent.parent.rename(by_name.parent.parent)  # as an earlier driver left it: filed by name
    spec_path = node.cdi_dir / f"{DRIVER}_metadata_{claim[2]}_gpu.json"
    spec_path.write_text(spec_path.read_text().replace(str(by_uid), str(by_name)))  # its spec mounting that file
    checkpoint = node.root / "plugins" / DRIVER / "checkpoint.json"
    document = json.loads(checkpoint.read_text())
    del document["claims"][claim[2]]["metadataGenerations"]  # nor did it keep generations
    checkpoint.write_text(json.dumps(document))
    inode = by_name.stat().st_ino  # what a running container has mounted

    driver = await node.start()
    assert mounted_file(node, claim) == by_uid and by_uid.stat().st_ino == inode
    assert not by_name.parent.parent.exists()
    node.write_boards([{"product": "BI-V150", "chips": [None, {"health": ["ECC"]}]}, {"product": "BI-V150"}])
    await wait_generation(by_uid, 2)  # written in place: the running container reads it
    assert by_uid.stat().st_ino == inode
