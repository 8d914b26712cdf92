"""The DRA driver through what a node goes through: reboots, lost and hostile checkpoints, odd claims, monitoring."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers.dra_support import DraNode, answer
from helpers.host_tools import tmpfs
from helpers.waits import until

from ix_device_plugin.dra.checkpoint import CHECKPOINT_FILE
from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.standins.apiserver import ApiServerStandIn


async def test_a_reboot_writes_every_claim_spec_again_before_serving(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin.dra")
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claims = [node.claim("a", ["gpu-0"]), node.claim("b", ["gpu-2", "gpu-3"])]
    before = {uid: answer(await kubelet.prepare([c]), uid) for c in claims for uid in [c[2]]}
    specs = {c[2]: (node.cdi_dir / cdi_spec_file(c[2])).read_text() for c in claims}
    await kubelet.close()
    await node.stop(driver)
    node.reboot()
    await api.refuse()  # nothing the restored claims need comes from the API server
    restarted = await node.start()
    assert {c[2]: (node.cdi_dir / cdi_spec_file(c[2])).read_text() for c in claims} == specs  # before any call
    assert "restored 2 prepared claims" in caplog.text and "(2 from an earlier boot)" in caplog.text
    kubelet = await node.kubelet(restarted)
    for claim in claims:
        assert answer(await kubelet.prepare([claim]), claim[2]) == before[claim[2]]
    assert json.loads(node.checkpoint_file.read_text())["bootID"] == node.boot_id_file.read_text().strip()
    await api.accept()
    await kubelet.close()


async def test_a_prepare_writes_a_missing_spec_again(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("c", ["gpu-1"])
    first = answer(await kubelet.prepare([claim]), claim[2])
    spec = node.cdi_dir / cdi_spec_file(claim[2])
    text = spec.read_text()
    spec.unlink()  # what a reboot does, seen by a driver that did not restart
    assert answer(await kubelet.prepare([claim]), claim[2]) == first
    assert spec.read_text() == text
    await kubelet.close()


async def test_a_corrupt_checkpoint_is_moved_aside_and_its_claims_rebuilt_from_their_specs(
    node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("held", ["gpu-2"])
    first = answer(await kubelet.prepare([claim]), claim[2])
    await kubelet.close()
    await node.stop(driver)
    node.checkpoint_file.write_bytes(b'{"version": 1, "claims": {"\xff\xfe": 1}}')  # not UTF-8
    restarted = await node.start()
    assert list(node.checkpoint_file.parent.glob(f"{CHECKPOINT_FILE}.corrupt-*"))
    assert "1 claims rebuilt from their CDI specs" in caplog.text
    kubelet = await node.kubelet(restarted)
    rival = node.claim("rival", ["gpu-2"])
    assert "is prepared for claim" in answer(await kubelet.prepare([rival]), rival[2]).error  # still held
    assert answer(await kubelet.prepare([claim]), claim[2]) == first  # read again, complete again
    assert restarted.state.claims[claim[2]].complete
    await kubelet.close()


async def test_only_the_newest_unreadable_checkpoints_are_kept_aside(node: DraNode) -> None:
    path = node.checkpoint_file
    path.parent.mkdir(parents=True)
    older = [path.with_name(f"{path.name}.corrupt-{1_700_000_000 + n}") for n in range(8)]
    for n, copy in enumerate(older):
        copy.write_text(f"spoiled {n}")
    other = path.with_name(f"{path.name}.operator-note")  # not one of the driver's copies: never touched
    other.write_text("mine")
    path.write_bytes(b"[" * 100)
    driver = await node.start()
    kept = sorted(path.parent.glob(f"{path.name}.corrupt-*"))
    assert len(kept) == 5
    assert kept[:4] == older[-4:]  # the oldest went first
    assert kept[4].read_bytes() == b"[" * 100  # the copy of what was spoiled now
    assert other.read_text() == "mine"
    assert json.loads(path.read_text())["claims"] == {}  # the rebuilt one is in place
    await node.stop(driver)


async def test_a_checkpoint_of_a_newer_driver_stops_the_start_and_is_kept(node: DraNode) -> None:
    path = node.checkpoint_file
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 2, "claims": {"u": {}}}))
    with pytest.raises(StartupError, match="checkpoint version 2 was written by a newer driver"):
        await node.start()
    assert json.loads(path.read_text())["version"] == 2


async def test_one_malformed_claim_fails_alone_and_a_hostile_uid_names_no_file(
    node: DraNode, api: ApiServerStandIn, short_dir: Path
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    good = node.claim("good", ["gpu-0"])
    bad = node.claim("bad", ["gpu-1"])
    stored = api.get("resourceclaims", "bad", "default")
    assert stored is not None
    stored["status"]["allocation"]["devices"]["results"] = "not a list"
    api.put("resourceclaims", stored)
    hostile = ("default", "evil", "../../escape")
    response = await kubelet.prepare([good, bad, hostile])
    assert answer(response, good[2]).error == "" and len(answer(response, good[2]).devices) == 1
    assert "results is not a list" in answer(response, bad[2]).error
    assert "invalid UID" in answer(response, hostile[2]).error
    assert not list(short_dir.rglob("*escape*"))
    await kubelet.close()


async def test_an_admin_claim_shares_a_chip_with_its_workload_and_leaves_it_alone(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    workload = node.claim("workload", ["gpu-1"])
    monitor = node.claim("monitor", ["gpu-1"], admin_access=True)
    rival = node.claim("rival", ["gpu-1"])
    assert answer(await kubelet.prepare([workload]), workload[2]).error == ""
    prepared = answer(await kubelet.prepare([monitor]), monitor[2])
    assert prepared.error == "" and [d.device_name for d in prepared.devices] == ["gpu-1"]
    assert "is prepared for claim default/workload" in answer(await kubelet.prepare([rival]), rival[2]).error
    assert answer(await kubelet.unprepare([monitor]), monitor[2]).error == ""
    assert (node.cdi_dir / cdi_spec_file(workload[2])).exists()
    assert not (node.cdi_dir / cdi_spec_file(monitor[2])).exists()
    assert "is prepared for claim default/workload" in answer(await kubelet.prepare([rival]), rival[2]).error
    spec = yaml.safe_load((node.cdi_dir / cdi_spec_file(workload[2])).read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/iluvatar1"
    await kubelet.close()


@pytest.fixture
def small_tmpfs(short_dir: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (root only), unmounted afterwards."""
    mount = short_dir / "plugins"
    mount.mkdir()
    with tmpfs(mount, "size=256k"):
        yield mount


def fill(directory: Path) -> Path:
    """Fill the file system under directory; the filler file, to remove later."""
    filler = directory / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(descriptor, b"\0" * 4096)
    finally:
        os.close(descriptor)
    return filler


async def test_a_full_disk_fails_the_prepare_and_the_unprepare_and_loses_no_chip(
    small_tmpfs: Path, node: DraNode
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    kept = node.claim("kept", ["gpu-0"])
    assert answer(await kubelet.prepare([kept]), kept[2]).error == ""
    filler = fill(small_tmpfs)
    lost = node.claim("lost", ["gpu-1"])
    assert "No space left on device" in answer(await kubelet.prepare([lost]), lost[2]).error
    assert "No space left on device" in answer(await kubelet.prepare([lost]), lost[2]).error  # a retry too
    assert lost[2] not in driver.state.claims and not (node.cdi_dir / cdi_spec_file(lost[2])).exists()
    assert "No space left on device" in answer(await kubelet.unprepare([kept]), kept[2]).error
    assert kept[2] in driver.state.claims
    await kubelet.close()
    await node.stop(driver)
    filler.unlink()
    restarted = await node.start()
    kubelet = await node.kubelet(restarted)
    rival = node.claim("rival", ["gpu-0"])
    assert "is prepared for claim default/kept" in answer(await kubelet.prepare([rival]), rival[2]).error
    other = node.claim("other", ["gpu-1"])
    assert answer(await kubelet.prepare([other]), other[2]).error == ""  # gpu-1 was never handed out
    await kubelet.close()


async def test_a_start_over_an_unreadable_checkpoint_on_a_full_disk_serves_its_claims_and_writes_them_later(
    small_tmpfs: Path, node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    """The rebuilt checkpoint cannot be written: the driver starts all the same (it used to exit, and the kubelet's
    crash back-off kept it away minutes after the disk had room), holds the claims its specs say, leaves the spoiled
    file where it was, and writes the rebuilt one at the first prepare once there is room."""
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    held = node.claim("held", ["gpu-2"])
    assert answer(await kubelet.prepare([held]), held[2]).error == ""
    await kubelet.close()
    await node.stop(driver)
    spoiled = b"\x00{not json \xff"
    node.checkpoint_file.write_bytes(spoiled)
    filler = fill(small_tmpfs)
    restarted = await node.start()
    assert "1 claims rebuilt from their CDI specs" in caplog.text and "not written" in caplog.text
    assert node.checkpoint_file.read_bytes() == spoiled
    assert not list(node.checkpoint_file.parent.glob(f"{CHECKPOINT_FILE}.corrupt-*"))
    kubelet = await node.kubelet(restarted)
    rival = node.claim("rival", ["gpu-2"])
    refused = answer(await kubelet.prepare([rival]), rival[2]).error
    assert "is prepared for claim" in refused and held[2] in refused  # unnamed: rebuilt from its spec
    filler.unlink()
    other = node.claim("other", ["gpu-1"])
    assert answer(await kubelet.prepare([other]), other[2]).error == ""
    assert set(json.loads(node.checkpoint_file.read_text())["claims"]) == {held[2], other[2]}
    assert [p.read_bytes() for p in node.checkpoint_file.parent.glob(f"{CHECKPOINT_FILE}.corrupt-*")] == [spoiled]
    await kubelet.close()


async def test_two_drivers_overlapping_in_an_update_fail_no_prepare(node: DraNode) -> None:
    old = await node.start(pod_uid="pod-old")
    await node.wait_slice(lambda devices: len(devices) == 6)
    new = await node.start(pod_uid="pod-new")
    assert old.registrar_socket != new.registrar_socket and old.endpoint != new.endpoint
    assert old.registrar_socket.is_socket() and new.registrar_socket.is_socket()  # both serve at once
    to_old, to_new = await node.kubelet(old), await node.kubelet(new)
    claims = [node.claim(f"c{i}", [f"gpu-{i % 4}"]) for i in range(8)]  # two claims want each chip
    calls = [(to_old if i % 2 else to_new).prepare([claim]) for i, claim in enumerate(claims)]
    answers = [answer(response, claim[2]) for response, claim in zip(await asyncio.gather(*calls), claims, strict=True)]
    won = [claim for claim, result in zip(claims, answers, strict=True) if not result.error]
    assert len(won) == 4  # one claim per chip, whichever driver answered
    assert all("is prepared for claim" in result.error for result in answers if result.error)
    await to_old.close()
    await node.stop(old)  # the old pod ends; its sockets go, the new driver's stay
    assert not old.registrar_socket.exists() and new.registrar_socket.is_socket()
    for claim in won:  # the new driver knows every claim the old one prepared
        assert answer(await to_new.prepare([claim]), claim[2]).error == ""
        assert answer(await to_new.unprepare([claim]), claim[2]).error == ""
    assert new.state.claims == {} and list(node.cdi_dir.glob("*.yaml")) == []
    await to_new.close()


async def test_slices_deleted_by_a_restarting_kubelet_are_published_again_at_registration(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    for stored in list(api.objects("resourceslices")):
        api.delete("resourceslices", stored["metadata"]["name"])  # what the kubelet does when it starts
    assert node.slice() is None
    kubelet = await node.kubelet(driver)  # the restarted kubelet registers the driver again
    await node.wait_slice(lambda devices: len(devices) == 6, timeout=2)
    assert node.slice()["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert driver.registration.registrations == 1
    await kubelet.close()


async def test_the_claim_status_says_the_chips_and_keeps_other_drivers_entries(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("status", ["gpu-2"])
    stored = api.get("resourceclaims", "status", "default")
    assert stored is not None
    other = {"driver": "net.example.com", "pool": "p", "device": "nic-0"}
    stored["status"]["devices"] = [other]
    api.put("resourceclaims", stored)
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    uuid = driver.content.by_name()["gpu-2"].chip.uuid

    def devices() -> list[dict]:
        found = api.get("resourceclaims", "status", "default")
        return [] if found is None else found["status"].get("devices") or []

    await until(lambda: len(devices()) >= 2, timeout=3)
    ours = devices()[1]
    assert devices()[0] == other
    assert (ours["driver"], ours["pool"], ours["device"]) == (DRIVER, node.node, "gpu-2")
    assert ours["data"]["uuid"] == uuid and ours["data"]["pciBusID"]
    assert answer(await kubelet.unprepare([claim]), claim[2]).error == ""
    await until(lambda: devices() == [other], timeout=3)
    await kubelet.close()


@pytest.mark.parametrize("how", ["deleted", "edited"])
async def test_a_slice_someone_else_changes_is_put_back_within_two_seconds(
    node: DraNode, api: ApiServerStandIn, how: str
) -> None:
    driver = await node.start(health_address="127.0.0.1:0")
    kubelet = await node.kubelet(driver)
    await node.wait_slice(lambda devices: len(devices) == 6)
    await api.watching("resourceslices")
    stored = node.slice()  # the devices' slice (the boards' counters have one of their own)
    assert stored is not None and len(api.objects("resourceslices")) == 2
    name = stored["metadata"]["name"]
    if how == "deleted":
        api.delete("resourceslices", name)
    else:
        stored["spec"]["devices"] = stored["spec"]["devices"][:1]
        api.put("resourceslices", stored)
    started = asyncio.get_running_loop().time()
    await node.wait_slice(lambda devices: len(devices) == 6, timeout=2)
    assert asyncio.get_running_loop().time() - started < 2
    assert driver.publisher is not None and driver.publisher.repairs >= 1
    await kubelet.close()


@pytest.mark.parametrize("how", ["deleted", "edited"])
async def test_a_slice_someone_else_changes_as_a_chip_breaks_is_put_back_with_the_chip_tainted(
    node: DraNode, api: ApiServerStandIn, how: str
) -> None:
    """The write for the health change goes over the slices last published: over an edit the watch has not shown
    yet it conflicts (or finds the slice gone) and reads them again; either way the stored slices end as wished."""
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    await api.watching("resourceslices")
    stored = node.slice()
    assert stored is not None
    if how == "deleted":
        api.delete("resourceslices", stored["metadata"]["name"])
    else:
        stored["spec"]["devices"] = stored["spec"]["devices"][:1]
        api.put("resourceslices", stored)
    node.write_boards([{"product": "BI-V150", "chips": [None, {"health": ["OverTemp"]}]}, {"product": "BI-V150"}])
    await node.wait_slice(lambda devices: len(devices) == 6 and "taints" in devices.get("gpu-1", {}), timeout=3)
    publisher = driver.publisher
    assert publisher is not None
    await until(lambda: publisher.missing() == [], message="the publisher's watch sees the slices it wrote")
