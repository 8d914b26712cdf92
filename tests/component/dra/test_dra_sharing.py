"""The DRA driver with boards and chips from one slice, shared chips, and per-claim GpuConfig (reset, sharing).

Real gRPC over unix sockets, the kubelet and API server stand-ins, the simulated backend (which records resets).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.dra_support import DraNode, answer, gpu_config
from helpers.waits import stays, until
from prometheus_client.parser import text_string_to_metric_families

from ix_device_plugin.core.inventory import Inventory
from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.dra.prepared import ClaimRef
from ix_device_plugin.dra.slices import DRIVER, slice_content
from ix_device_plugin.dra.state import DraState
from ix_device_plugin.hardware.simulated import SimulatedBackend, parse_spec
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.apiserver import ApiServerStandIn

SHARED = Config(splitboard=True, replicas=4)


async def settled(api: ApiServerStandIn) -> None:
    """Wait until every slice of the pool is at one generation (a write of several slices is over)."""
    await until(lambda: len({s["spec"]["pool"]["generation"] for s in api.objects("resourceslices")}) == 1, timeout=5)


def metrics(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families = text_string_to_metric_families(text.decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


async def test_a_board_claim_and_a_chip_claim_from_one_slice(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    board, chip, rival = node.claim("board", ["board-0"]), node.claim("chip", ["gpu-2"]), node.claim("r", ["gpu-1"])
    response = await kubelet.prepare([board, chip])
    assert [d.device_name for d in answer(response, board[2]).devices] == ["board-0"]
    spec = yaml.safe_load((node.cdi_dir / cdi_spec_file(board[2])).read_text())
    paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert paths == ["/dev/iluvatar0", "/dev/iluvatar1"]
    refused = answer(await kubelet.prepare([rival]), rival[2]).error
    assert "gpu-1" in refused and "default/board" in refused and "as part of board-0" in refused
    values = metrics(driver.metrics.render())
    assert values[("ix_device_plugin_dra_prepared_devices", (("held", "whole"), ("type", "board")))] == 1
    assert values[("ix_device_plugin_dra_prepared_devices", (("held", "whole"), ("type", "chip")))] == 1
    await kubelet.unprepare([board])
    assert answer(await kubelet.prepare([rival]), rival[2]).error == ""
    await kubelet.close()


async def test_four_shares_of_one_chip_and_unpreparing_one_leaves_three(node: DraNode, api: ApiServerStandIn) -> None:
    driver = await node.start(config=SHARED)
    await node.wait_slice(lambda devices: sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
    assert node.slice_devices()["gpu-0"]["capacity"]["shares"]["value"] == "4"
    kubelet = await node.kubelet(driver)
    shares = [node.claim(f"share-{i}", ["gpu-0"], shares=1) for i in range(4)]
    response = await kubelet.prepare(shares)
    uuid = driver.content.by_name()["gpu-0"].chip.uuid
    replicas = []
    for claim in shares:
        (device,) = answer(response, claim[2]).devices
        share_id = api.get("resourceclaims", claim[1], "default")["status"]["allocation"]["devices"]["results"][0]
        assert device.share_id == share_id["shareID"]
        assert list(device.cdi_device_ids) == [
            f"gpu.iluvatar.com/claim={claim[2]}-gpu-0-{device.share_id}",
            f"gpu.iluvatar.com/metadata={claim[2]}_gpu",
        ]
        env = yaml.safe_load((node.cdi_dir / cdi_spec_file(claim[2])).read_text())["containerEdits"]["env"]
        assert f"IX_VISIBLE_DEVICES={uuid}" in env
        replicas += [item.partition("=")[2] for item in env if item.startswith("IX_REPLICA_DEVICES=")]
    assert sorted(replicas) == [f"{uuid}::{slot}" for slot in range(4)]
    fifth = node.claim("share-4", ["gpu-0"], shares=1)
    assert "gpu-0 has 4 shares: 4 are prepared for" in answer(await kubelet.prepare([fifth]), fifth[2]).error
    assert answer(await kubelet.unprepare([shares[1]]), shares[1][2]).error == ""
    assert sorted(p.name for p in node.cdi_dir.glob("*.yaml")) == sorted(
        cdi_spec_file(c[2]) for c in shares if c != shares[1]
    )
    checkpoint = json.loads(node.checkpoint_file.read_text())
    assert sorted(d["slots"] for c in checkpoint["claims"].values() for d in c["devices"]) == [[0], [2], [3]]
    assert answer(await kubelet.prepare([fifth]), fifth[2]).error == ""  # the freed share
    values = metrics(driver.metrics.render())
    assert values[("ix_device_plugin_dra_prepared_devices", (("held", "share"), ("type", "chip")))] == 4

    def status(claim: tuple[str, str, str]) -> list[dict[str, Any]]:
        return (api.get("resourceclaims", claim[1], "default") or {}).get("status", {}).get("devices") or []

    await until(lambda: status(fifth), timeout=3)
    (entry,) = status(fifth)
    assert entry["shareID"] and entry["data"] == {"uuid": uuid, "pciBusID": entry["data"]["pciBusID"], "slots": [1]}
    await kubelet.close()


async def test_a_claim_with_admin_access_rebuilt_from_its_spec_still_holds_its_chip_for_nobody(
    node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    """A monitoring claim (adminAccess) on gpu-0 and all the shares of gpu-1, the checkpoint made unreadable and the
    driver stopped (a soak's checkpoint-unreadable fault and kill): at start both claims come back from their CDI
    specs, the monitoring one still holding gpu-0 for nobody, so a share the scheduler allocated beside it (the
    monitoring pod being deleted, its unprepare still to come) is prepared. Rebuilt without its admin access, it held
    gpu-0 whole and refused it ("is prepared for claim unnamed")."""
    driver = await node.start(config=SHARED)
    await node.wait_slice(lambda devices: sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
    kubelet = await node.kubelet(driver)
    monitor, held = node.claim("monitor", ["gpu-0"], admin_access=True), node.claim("held", ["gpu-1"], shares=4)
    for claim in (monitor, held):
        assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await kubelet.close()
    node.checkpoint_file.write_bytes(b"\x00{not json \xff")
    await node.stop(driver)
    restarted = await node.start(config=SHARED)
    assert "2 claims rebuilt from their CDI specs" in caplog.text
    assert [device.admin for device in restarted.state.claims[monitor[2]].devices] == [True]
    assert json.loads(node.checkpoint_file.read_text())["claims"][monitor[2]]["devices"][0]["admin"] is True
    kubelet = await node.kubelet(restarted)
    work, rival = node.claim("work", ["gpu-0"], shares=1), node.claim("rival", ["gpu-1"])
    assert answer(await kubelet.prepare([work]), work[2]).error == ""
    assert "is prepared for claim unnamed" in answer(await kubelet.prepare([rival]), rival[2]).error  # shares held
    assert answer(await kubelet.unprepare([monitor]), monitor[2]).error == ""
    await kubelet.close()


async def test_whole_boards_are_shared_when_boards_are_not_split(node: DraNode) -> None:
    driver = await node.start(config=Config(splitboard=False, replicas=2))
    await node.wait_slice(lambda devices: sorted(devices) == ["board-0", "board-2"])
    kubelet = await node.kubelet(driver)
    shares = [node.claim(f"s{i}", ["board-2"], shares=1) for i in range(2)]
    response = await kubelet.prepare(shares)
    assert all(answer(response, claim[2]).error == "" for claim in shares)
    env = yaml.safe_load((node.cdi_dir / cdi_spec_file(shares[1][2])).read_text())["containerEdits"]["env"]
    board = driver.content.by_name()["board-2"]
    assert f"IX_VISIBLE_DEVICES={','.join(chip.uuid for chip in board.chips)}" in env
    assert f"IX_REPLICA_DEVICES={board.uuid}::1" in env
    await kubelet.close()


async def test_a_config_error_fails_that_claim_alone_naming_the_field(node: DraNode) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    bad = node.claim("bad", ["gpu-0"], config=[gpu_config("FromClass", reset="please")])
    good = node.claim("good", ["gpu-1"], config=[gpu_config(reset=False)])
    response = await kubelet.prepare([bad, good])
    error = answer(response, bad[2]).error
    assert "status.allocation.devices.config[0].opaque.parameters.reset: expected true or false" in error
    assert list(answer(response, bad[2]).devices) == [] and not (node.cdi_dir / cdi_spec_file(bad[2])).exists()
    assert answer(response, good[2]).error == ""
    await kubelet.close()


async def test_a_claim_configured_with_reset_is_reset_with_the_handshake_before_it_is_answered(
    node: DraNode, api: ApiServerStandIn
) -> None:
    backend = SimulatedBackend(str(node.devices_file))
    driver = await node.start(backend_factory=lambda: backend, reset_wait_timeout=2.0, reset_timeout=5.0)
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    board = driver.content.by_name()["board-2"]
    claim = node.claim("fresh", ["board-2"], config=[gpu_config("FromClass", reset=True)])
    plain = node.claim("plain", ["gpu-0"])
    response = await kubelet.prepare([claim, plain])
    assert answer(response, claim[2]).error == "" and answer(response, plain[2]).error == ""
    assert backend.resets == [tuple(chip.uuid for chip in board.chips)]  # the board's chips, once
    assert driver.api is not None
    handshake = api.get("configmaps", f"ix-gpu-reset-{node.node}", driver.api.namespace)
    assert yaml.safe_load(handshake["data"]["gpuReset"]) == {
        "nodename": node.node, "occupy": {"ix-device-plugin": True}, "reset": False
    }  # fmt: skip
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""  # answered again, not reset again
    assert len(backend.resets) == 1
    values = metrics(driver.metrics.render())
    assert values[("ix_device_plugin_dra_gpu_resets_total", (("result", "ok"),))] == 1
    await kubelet.close()


async def test_a_reset_that_fails_fails_the_prepare_and_holds_nothing(node: DraNode) -> None:
    uuid = "GPU-cccc0000-0000-0000-0000-000000000003"
    node.devices_file.write_text(
        yaml.safe_dump(
            {"boards": [{"product": "BI-V100", "chips": [{"uuid": uuid, "minor": 0}]}], "reset": {"fail": [uuid]}}
        )
    )
    driver = await node.start(reset_wait_timeout=2.0, reset_timeout=5.0)
    await node.wait_slice(lambda devices: list(devices) == ["gpu-0"])
    kubelet = await node.kubelet(driver)
    claim = node.claim("doomed", ["gpu-0"], config=[gpu_config(reset=True)])
    error = answer(await kubelet.prepare([claim]), claim[2]).error
    assert "GPU reset before the container starts" in error and f"{uuid} did not reset" in error
    assert driver.state.claims == {} and not (node.cdi_dir / cdi_spec_file(claim[2])).exists()
    other = node.claim("next", ["gpu-0"])
    assert answer(await kubelet.prepare([other]), other[2]).error == ""  # the chip was not kept
    values = metrics(driver.metrics.render())
    assert values[("ix_device_plugin_dra_gpu_resets_total", (("result", "failed"),))] == 1
    await kubelet.close()


async def test_a_prepare_or_unprepare_of_a_claim_being_reset_waits_for_the_reset(short_dir: Path) -> None:
    state = DraState(short_dir / "plugins", short_dir / "cdi", "node-a", short_dir)
    await state.restore()
    devices = slice_content(Inventory(boards=parse_spec("BI-V100:1"))).by_name()
    ref = ClaimRef("default", "fresh", "uid-1")
    allocation = {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}],
                              "config": [gpu_config(reset=True)]}}  # fmt: skip
    claim = {"metadata": {"uid": ref.uid}, "status": {"allocation": allocation}}
    started, release, resets = asyncio.Event(), asyncio.Event(), []

    async def read(_: ClaimRef) -> dict[str, Any]:
        return claim

    async def reset(prepared: Any) -> str | None:
        resets.append(prepared.reset_chips)
        started.set()
        await release.wait()
        return None

    first = asyncio.create_task(state.prepare(ref, read, devices, (), reset))
    await started.wait()
    second = asyncio.create_task(state.prepare(ref, read, devices, (), reset))
    undo = asyncio.create_task(state.unprepare(ref))
    await stays(
        lambda: not second.done() and not undo.done(),
        for_=0.1,
        message="no container starts before its chips are reset",
    )
    release.set()
    assert await first == await second and await undo is None
    assert set(resets) == {(devices["gpu-0"].chip.uuid,)}


async def test_a_restart_that_changes_nothing_writes_nothing_and_keeps_the_boards(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    await settled(api)
    stored = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in api.objects("resourceslices")}
    await node.stop(driver)
    restarted = await node.start()
    await until(lambda: restarted.publisher is not None and restarted.publisher.published is not None, timeout=5)
    # not even for a moment without the boards: their chips would look free to the scheduler
    assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in api.objects("resourceslices")} == stored
    assert restarted.publisher.counters is True


async def test_after_a_reboot_with_a_board_prepared_the_boards_come_back_in_the_first_write(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    board = node.claim("board", ["board-0"])
    assert answer(await kubelet.prepare([board]), board[2]).error == ""
    await kubelet.close()
    await node.stop(driver)
    node.reboot()
    for stored in api.objects("resourceslices"):  # what the kubelet does when it starts
        api.delete("resourceslices", stored["metadata"]["name"])
    await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    assert node.slice()["spec"]["pool"]["generation"] == 1  # one write, the boards in it


async def test_a_server_without_counters_gets_chips_only_even_when_it_stops_keeping_them(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    api.shared_counters = False
    first = await node.start()
    await node.wait_slice(lambda devices: sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
    # the first write's counter slice, stored empty, goes at the second
    await until(lambda: first.publisher is not None and first.publisher.counters is False, timeout=5)
    await until(lambda: len(api.objects("resourceslices")) == 1, timeout=5)
    assert "drops shared counters" in caplog.text
    await node.stop_all()
    api.shared_counters = True
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    api.shared_counters = False  # a server downgraded under a running driver: its next write says so
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150", "chips": [None, {"health": ["ECC"]}]}])
    await node.wait_slice(lambda devices: sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
    assert driver.publisher is not None and driver.publisher.counters is False


async def test_a_server_without_consumable_capacity_gets_each_device_once(node: DraNode, api: ApiServerStandIn) -> None:
    api.consumable_capacity = False
    await node.start(config=SHARED)
    await node.wait_slice(lambda devices: len(devices) == 4)
    device = node.slice_devices()["gpu-0"]
    assert "allowMultipleAllocations" not in device and "requestPolicy" not in device["capacity"]["shares"]
    version = node.slice()["metadata"]["resourceVersion"]
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150", "chips": [None, {"health": ["ECC"]}]}])
    await node.wait_slice(lambda devices: "taints" in devices["gpu-3"])
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150"}])
    await node.wait_slice(lambda devices: "taints" not in devices["gpu-3"])
    stored = node.slice()["metadata"]["resourceVersion"]
    await stays(
        lambda: node.slice()["metadata"]["resourceVersion"] == stored != version,
        for_=0.3,
        message="written for changes only",
    )
