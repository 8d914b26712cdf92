"""Self-healing in DRA mode: an XID taints the chip's devices; once no prepared claim holds the chip (or its board) it
is reset (a fake ixsmi), the taint goes, the kubelet's health stream says HEALTHY, and a new claim can take it."""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from helpers.dra_support import TWO_BOARDS, DraNode
from helpers.reset_support import FAST_HEALING, Ixsmi, IxsmiBackend, node_events
from helpers.waits import stays, until

from ix_device_plugin.core.inventory import ChipStatus
from ix_device_plugin.dra.driver import DraDriver
from ix_device_plugin.dra.slices import UNHEALTHY_TAINT
from ix_device_plugin.dra.state import RESET_LOCK_FILE
from ix_device_plugin.healing.operatorreturn import RETURN_ANNOTATION
from ix_device_plugin.healing.record import record_path
from ix_device_plugin.standins.apiserver import ApiServerStandIn

STEPS = ("GPUXidError", "GPUUnhealthy", "GPUHealingReset", "GPUHealthy")


def with_xid(xid: int) -> list[dict[str, Any]]:
    """The node's two BI-V150 boards, chip gpu-1 (the first board's second) with an XID."""
    return [{"product": "BI-V150", "chips": [None, {"xids": [xid]}]}, TWO_BOARDS[1]]


async def start(node: DraNode, ixsmi: Ixsmi) -> DraDriver:
    return await node.start(
        backend_factory=lambda: IxsmiBackend(node.devices_file, ixsmi.path), healing_rules=FAST_HEALING
    )


async def acting_and_standby(node: DraNode, ixsmi: Ixsmi) -> tuple[DraDriver, DraDriver]:
    """The pod acting for the node, its slices published, and a pod on standby beside it whose library tells it no
    XID (the library hands an XID to one listener: the acting pod's)."""
    acting = await start(node, ixsmi)
    await node.wait_slice(lambda devices: len(devices) == 6)
    quiet_file = node.root / "devices-without-xids.yaml"
    quiet_file.write_text(node.devices_file.read_text())
    standby = await node.start(
        backend_factory=lambda: IxsmiBackend(quiet_file, ixsmi.path), healing_rules=FAST_HEALING, pod_uid="pod-new"
    )
    return acting, standby


def tainted(devices: dict[str, dict[str, Any]], name: str) -> bool:
    return any(taint["key"] == UNHEALTHY_TAINT for taint in devices.get(name, {}).get("taints", []))


def uuid_of(node: DraNode, name: str) -> str:
    return str(node.slice_devices()[name]["attributes"]["uuid"]["string"])


async def test_an_xid_on_a_free_chip_is_reset_and_the_taint_goes(node: DraNode, api: ApiServerStandIn) -> None:
    ixsmi = Ixsmi(node.root)
    driver = await start(node, ixsmi)
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    health = await kubelet.watch_health()
    chip = uuid_of(node, "gpu-1")
    node.write_boards(with_xid(48))
    await node.wait_slice(lambda devices: tainted(devices, "gpu-1") and tainted(devices, "board-0"))
    await health.wait_for(lambda watch: watch.devices.get("gpu-1", ("",))[0] == "UNHEALTHY")
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1") and not tainted(devices, "board-0"), timeout=10)
    await health.wait_for(lambda watch: watch.devices["gpu-1"] == ("HEALTHY", ""))
    assert ixsmi.runs() == [f"-r -i {chip}"]  # that chip only
    await until(lambda: all(node_events(api, reason) for reason in STEPS))
    for reason in STEPS:
        [event] = node_events(api, reason)
        assert f"GPU 1 ({chip})" in event["message"] and event["involvedObject"]["name"] == node.node
    claim = node.claim("after", ["gpu-1"])
    assert (await kubelet.prepare([claim])).claims[claim[2]].error == ""  # a new claim can take the chip
    metrics = driver.metrics.render().decode()  # the same names as the device plugin's: one dashboard for both
    assert 'ix_device_plugin_healing_resets_total{result="ok"} 1.0' in metrics
    assert 'ix_device_plugin_healing_outcomes_total{outcome="healed"} 1.0' in metrics
    assert "ix_device_plugin_gpu_out_of_service_seconds_count 1.0" in metrics
    await health.close()
    await kubelet.close()


async def test_a_chip_held_by_a_prepared_claim_waits_until_it_is_unprepared(
    node: DraNode, api: ApiServerStandIn
) -> None:
    ixsmi = Ixsmi(node.root)
    driver = await start(node, ixsmi)
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    board = node.claim("whole-board", ["board-0"])  # holds gpu-0 and gpu-1
    assert (await kubelet.prepare([board])).claims[board[2]].error == ""
    node.write_boards(with_xid(63))
    await node.wait_slice(lambda devices: tainted(devices, "gpu-1"))
    await until(lambda: bool(node_events(api, "GPUHealingWaiting")))
    await stays(
        lambda: ixsmi.runs() == [] and tainted(node.slice_devices(), "gpu-1"),
        for_=0.8,
        message='ixsmi.runs() == [] and tainted(node.slice_devices(), "gpu-1")',
    )
    assert f"held by claim default/whole-board (uid {board[2]})" in node_events(api, "GPUHealingWaiting")[0]["message"]
    assert (await kubelet.unprepare([board])).claims[board[2]].error == ""
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1"), timeout=10)
    assert ixsmi.runs() == [f"-r -i {uuid_of(node, 'gpu-1')}"]
    again = node.claim("again", ["board-0"])
    assert (await kubelet.prepare([again])).claims[again[2]].error == ""
    await kubelet.close()


async def test_no_claim_is_prepared_on_a_chip_while_it_is_reset(node: DraNode) -> None:
    ixsmi = Ixsmi(node.root)
    ixsmi.delay.write_text("1")
    driver = await start(node, ixsmi)
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    node.write_boards(with_xid(48))
    await until(lambda: ixsmi.runs() != [], timeout=5)
    monitoring = node.claim("monitor", ["gpu-1"], admin_access=True)  # admin access takes even an unhealthy chip
    result = (await kubelet.prepare([monitoring])).claims[monitoring[2]]
    assert "is reserved for a GPU reset (self-healing clears an error on it)" in result.error
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1"), timeout=10)
    assert (await kubelet.prepare([monitoring])).claims[monitoring[2]].error == ""
    await kubelet.close()


async def test_the_reset_waits_for_the_nodes_reset_turn_held_by_another_pod(node: DraNode) -> None:
    """Another pod of the driver (an update's overlap) holds the node's reset turn: the healer waits for it."""
    ixsmi = Ixsmi(node.root)
    driver = await start(node, ixsmi)
    await node.wait_slice(lambda devices: len(devices) == 6)
    turn = os.open(driver.state.directory / RESET_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(turn, fcntl.LOCK_EX)
        node.write_boards(with_xid(48))
        await node.wait_slice(lambda devices: tainted(devices, "gpu-1"))
        await stays(lambda: ixsmi.runs() == [], for_=0.8, message="nothing reset under the other pod's turn")
    finally:
        os.close(turn)
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1"), timeout=10)
    assert len(ixsmi.runs()) == 1


async def test_an_operator_returns_a_chip_through_the_node_the_driver_watches_already(
    node: DraNode, api: ApiServerStandIn
) -> None:
    """XID 79 needs an operator: nothing is reset until the Node's annotation names the chip; the driver reads it
    from the one watch of its Node it keeps for the slices' owner."""
    ixsmi = Ixsmi(node.root)
    driver = await start(node, ixsmi)
    assert "gpu-return" not in driver.node.healing.tasks()
    await node.wait_slice(lambda devices: len(devices) == 6)
    node.write_boards(with_xid(79))
    await node.wait_slice(lambda devices: tainted(devices, "gpu-1"))
    await until(lambda: bool(node_events(api, "GPUNeedsOperator")))
    await stays(lambda: ixsmi.runs() == [], for_=0.5, message="ixsmi.runs() == []")
    stored = api.get("nodes", node.node)
    assert stored is not None
    stored["metadata"].setdefault("annotations", {})[RETURN_ANNOTATION] = "1"  # its index
    api.put("nodes", stored)
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1"), timeout=10)
    assert ixsmi.runs() == [f"-r -i {uuid_of(node, 'gpu-1')}"]
    assert node_events(api, "GPUReturnRequested")
    node_watches = [r for r in api.requests if r.path.endswith("/nodes") and r.query.get("watch") in ("true", "1")]
    assert len(node_watches) == 1  # one watch of the Node, not one more for the annotation


async def test_a_fault_healed_by_a_reset_rewrites_the_pool_three_times_not_at_each_step(
    node: DraNode, api: ApiServerStandIn
) -> None:
    """Seed 845231: an XID storm made each chip's fault four pool writes within 0.1 s (its health, healing's
    taint, the reset's end, the taint gone), each replacing both slices of the pool: 222 requests a minute. What
    one fault changes within a moment is written at once: out of service, resetting, back."""
    ixsmi = Ixsmi(node.root)
    await start(node, ixsmi)
    await node.wait_slice(lambda devices: len(devices) == 6)
    before = len(api.requests)
    node.write_boards(with_xid(48))
    await until(lambda: bool(ixsmi.runs()))
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1"), timeout=10)
    writes = [r.path for r in api.requests[before:] if r.method == "PUT" and "/resourceslices/" in r.path]
    assert len(writes) <= 3 * len(set(writes)), writes  # each slice of the pool written three times at most


def annotate_return(api: ApiServerStandIn, node: DraNode, value: str) -> None:
    stored = api.get("nodes", node.node)
    assert stored is not None
    stored["metadata"].setdefault("annotations", {})[RETURN_ANNOTATION] = value
    api.put("nodes", stored)


async def test_a_return_made_while_the_driver_was_away_is_heard_by_the_next_one_and_one_heard_is_not_made_again(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """Seed 845231: an operator named a chip that needed one while the driver restarted; the next driver took what
    the annotation named at its first read as named before it started, and the chip stayed out for good. The
    node-health record now says which chips the annotation named, each asked for already (`returnsSeen`)."""
    caplog.set_level(logging.INFO, logger="ix_device_plugin.healing")
    ixsmi = Ixsmi(node.root)
    driver = await start(node, ixsmi)
    await node.wait_slice(lambda devices: len(devices) == 6)
    annotate_return(api, node, "0")  # a chip that needs none: heard, nothing to do
    await until(lambda: "names GPU 0: an operator asks to return it" in caplog.text)
    node.write_boards(with_xid(79))
    await node.wait_slice(lambda devices: tainted(devices, "gpu-1"))
    await until(lambda: bool(node_events(api, "GPUNeedsOperator")))
    await node.stop(driver)
    annotate_return(api, node, "0,1")  # gpu-1 returned while no driver watches
    driver = await start(node, ixsmi)
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1"), timeout=10)
    assert ixsmi.runs() == [f"-r -i {uuid_of(node, 'gpu-1')}"]
    await until(lambda: "returnsSeen" in record_path(node.root / "plugins").read_text())
    record = json.loads(record_path(node.root / "plugins").read_text())
    assert record["returnsSeen"] == ["0", "1"]

    node.write_boards(with_xid(64))  # it needs an operator again; the annotation still names it, from before
    await node.wait_slice(lambda devices: tainted(devices, "gpu-1"))
    await node.stop(driver)
    await start(node, ixsmi)
    await node.wait_slice(lambda devices: tainted(devices, "gpu-1"))
    await stays(lambda: len(ixsmi.runs()) == 1, for_=1.0, message="the return heard before is not made again")


async def test_only_the_pod_holding_the_nodes_role_heals(node: DraNode, api: ApiServerStandIn) -> None:
    """Two pods of the driver during an update: the one publishing the node's slices resets the chip; the other,
    on standby, follows the chip but neither resets it nor writes Events."""
    ixsmi = Ixsmi(node.root)
    first = await start(node, ixsmi)
    await node.wait_slice(lambda devices: len(devices) == 6)
    second = await node.start(
        backend_factory=lambda: IxsmiBackend(node.devices_file, ixsmi.path),
        healing_rules=FAST_HEALING,
        pod_uid="pod-two",
    )
    assert first.node.role.held and not second.node.role.held
    node.write_boards(with_xid(48))
    await until(lambda: bool(second.node.healing.healer.cares) and "XID 48" in str(second.node.healing.healer.cares))
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1") and bool(ixsmi.runs()), timeout=10)
    await stays(lambda: len(ixsmi.runs()) == 1, for_=0.8, message="the acting pod's reset only")
    assert len(node_events(api, "GPUUnhealthy")) == 1 and len(node_events(api, "GPUHealingReset")) == 1


# ------------------------------------------------------------------ two pods of the driver (a rolling update)


async def test_during_a_rolling_update_no_pod_prepares_a_claim_on_a_chip_being_reset(node: DraNode) -> None:
    """The old pod resets gpu-1 for an XID only it was told of (the library hands an XID to one listener); the new
    pod, on standby, refuses claims on the chip while the reset runs, knows the XID, and when the old pod stops in
    the middle of the reset, publishes the chip tainted and resets it itself before it is back in service."""
    ixsmi = Ixsmi(node.root)
    ixsmi.delay.write_text("3")
    old, new = await acting_and_standby(node, ixsmi)
    kubelet = await node.kubelet(new)  # the kubelet serves the newest registration
    assert (old.node.role.held, new.node.role.held) == (True, False)
    assert (
        old.node.monitor.xids_watched and not new.node.monitor.xids_watched
    )  # every XID reaches the pod acting for the node
    chip = uuid_of(node, "gpu-1")
    node.write_boards(with_xid(48))  # the old pod's library only
    await until(lambda: ixsmi.runs() != [], timeout=5)  # the reset runs (3 s)
    await until(lambda: 48 in _chip_status(new, chip).xids, timeout=2)  # the standby knows the XID
    assert _chip_status(new, chip).held_out == "reserved for a GPU reset"
    monitoring = node.claim("monitor", ["gpu-1"], admin_access=True)
    ordinary = node.claim("work", ["gpu-1"])
    error = (await kubelet.prepare([monitoring])).claims[monitoring[2]].error  # admin access: the reservation
    assert "is reserved for a GPU reset" in error, error
    error = (await kubelet.prepare([ordinary])).claims[ordinary[2]].error
    assert "device gpu-1" in error and "is reserved for a GPU reset" in error, error  # the record, not the XID
    await node.stop(old)  # the update's stop, in the middle of the reset
    await until(lambda: new.node.role.held and new.node.monitor.xids_watched, timeout=3)
    await node.wait_slice(lambda devices: tainted(devices, "gpu-1"), timeout=3)  # no reset was confirmed
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1"), timeout=15)  # the new pod's own reset
    assert ixsmi.runs() == [f"-r -i {chip}"] * 2
    assert (await kubelet.prepare([ordinary])).claims[ordinary[2]].error == ""
    await kubelet.close()


def _chip_status(driver: DraDriver, uuid: str) -> ChipStatus:
    return next(chip.status for chip in driver.node.monitor.view.inventory.chips() if chip.uuid == uuid)


async def test_a_record_removed_or_spoiled_during_an_update_makes_no_pod_forget_a_chip_needing_an_operator(
    node: DraNode,
) -> None:
    """XID 64 on gpu-1, told to the old pod only; the record is removed, then spoiled: the new pod, on standby, keeps
    the XID (the old pod writes the record again), and after the handover gpu-1 is published tainted and the record
    says it needs an operator."""
    ixsmi = Ixsmi(node.root)
    old, new = await acting_and_standby(node, ixsmi)
    chip = uuid_of(node, "gpu-1")
    node.write_boards(with_xid(64))  # the old pod's library only
    await until(lambda: 64 in _chip_status(new, chip).xids, timeout=5)
    record = record_path(node.root / "plugins")
    for spoil in (record.unlink, lambda: record.write_text("[")):
        spoil()
        # watched: the standby never forgets it
        await stays(lambda: 64 in _chip_status(new, chip).xids, for_=0.5, message="the standby remembering XID 64")
    await node.stop(old)
    await until(lambda: new.node.role.held, timeout=5)
    await node.wait_slice(lambda devices: tainted(devices, "gpu-1"), timeout=5)
    await until(lambda: _recorded(record, chip).get("phase") == "operator", timeout=5)
    assert 64 in _chip_status(new, chip).xids and ixsmi.runs() == []


def _recorded(record: Path, uuid: str) -> dict[str, Any]:
    try:
        return dict(json.loads(record.read_text())["chips"].get(uuid, {}))
    except (OSError, ValueError):
        return {}
