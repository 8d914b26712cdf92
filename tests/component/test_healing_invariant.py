"""Self-healing never resets a chip a container holds or may be given, and what it knows outlives the process
(device plugin mode): holders under any resource name, the chip reserved through the handshake, the last look before
ixsmi, the node-health record across a restart, and the handshake repaired at start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.broken_chip import BrokenChip
from helpers.reset_support import EXPORTER, FAST_HEALING, NODE, Ixsmi, node_events, reset_document, write_document
from helpers.support import RESOURCE, TWO_CHIPS, config_flags
from helpers.waits import stays, until

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.gpureset.sequence import OUR_NAME, ResetInfo
from ix_device_plugin.healing.record import RECORD_FILE, record_path
from ix_device_plugin.kubelet.podresources import KUBELET_SETTLE
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn, ResourceView
from ix_device_plugin.standins.podresources import PodResourcesStandIn

HELD_LONG_ENOUGH = FAST_HEALING.settle + 1.0  # the settling time and several looks at pod-resources


def record_of(daemon: Daemon) -> dict:
    assert daemon.options.kubelet_plugins_directory_path is not None
    return json.loads(record_path(daemon.options.kubelet_plugins_directory_path).read_text())


async def never_healthy(view: ResourceView, device: str, seconds: float) -> None:
    await stays(lambda: view.devices[device] == UNHEALTHY, for_=seconds, message=f"{device} advertised Unhealthy")


async def test_a_chip_held_under_a_resource_name_no_longer_served_is_not_reset(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    """The pod was admitted under iluvatar.com/gpu; the config now names the resource otherwise (a rename)."""
    renamed = "iluvatar.com/gpu-renamed"
    await broken_chip.start(given=config_flags(resource_name=renamed))
    view = await kubelet.wait_registered(renamed, capacity=2)
    broken_chip.held("GPU-x1")
    broken_chip.breaks(1, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    await stays(lambda: ixsmi.runs() == [], for_=HELD_LONG_ENOUGH, message="ixsmi.runs() == []")
    await until(lambda: bool(node_events(apiserver, "GPUHealingWaiting")))
    assert "held by ml/trainer-0 (main)" in node_events(apiserver, "GPUHealingWaiting")[0]["message"]
    broken_chip.released()  # the pod was deleted
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=10)
    assert ixsmi.runs() == ["-r -i GPU-x1"]


async def test_a_reserved_chip_stays_out_of_service_when_its_error_clears_during_the_handshake(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, conf: Path
) -> None:
    """A memory-controller error (a reset clears it) on a free chip: reserved, reset: true, ix-exporter slow to let
    go; the error clears meanwhile, and still the chip is out of service and refused until the reset is done."""
    write_document(apiserver, ResetInfo(NODE, occupy={EXPORTER: True}))
    daemon, view = await broken_chip.started()
    conf.write_text(TWO_CHIPS.replace("minor=1 ", "minor=1 health=0x2 "))
    await until(lambda: (reset_document(apiserver) or ResetInfo(NODE)).reset, timeout=5)  # asking it to let go
    conf.write_text(TWO_CHIPS)  # the error cleared by itself
    await stays(lambda: view.devices["GPU-x1"] == UNHEALTHY, for_=0.5, message="several health polls")
    with pytest.raises(Exception, match="Unhealthy"):
        await kubelet.allocate(RESOURCE, [["GPU-x1"]])
    assert record_of(daemon)["chips"]["GPU-x1"]["reserved"]["reason"] == "reserved for a GPU reset"
    info = reset_document(apiserver)
    assert info is not None
    write_document(apiserver, ResetInfo(NODE, True, {**info.occupy, EXPORTER: False}))  # it lets go at last
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=10)
    assert ixsmi.runs() == ["-r -i GPU-x1"]
    await until(lambda: "reserved" not in record_of(daemon)["chips"]["GPU-x1"])  # released; its one reset kept
    assert record_of(daemon)["chips"]["GPU-x1"]["phase"] == "healthy"
    assert len(record_of(daemon)["chips"]["GPU-x1"]["resets"]) == 1


async def test_a_chip_found_held_after_the_handshake_is_not_reset(
    broken_chip: BrokenChip, ixsmi: Ixsmi, apiserver: ApiServerStandIn, pod_resources: PodResourcesStandIn
) -> None:
    """The last look, immediately before ixsmi: a holder that appeared while the others were asked to let go (here
    through a device ID of the board, under another name) calls the reset off."""
    write_document(apiserver, ResetInfo(NODE, occupy={EXPORTER: True}))
    daemon, view = await broken_chip.started()
    broken_chip.breaks(1, 48)
    await until(lambda: (reset_document(apiserver) or ResetInfo(NODE)).reset, timeout=5)
    pod_resources.pods = {("ml", "late"): {"main": {f"{RESOURCE}.shared": ["GPU-x1::2"]}}}
    info = reset_document(apiserver)
    assert info is not None
    write_document(apiserver, ResetInfo(NODE, True, {**info.occupy, EXPORTER: False}))
    await until(lambda: not (reset_document(apiserver) or ResetInfo(NODE, True)).reset, timeout=5)  # handed back
    healer = daemon.node.healing.healer
    await until(lambda: "held by ml/late (main)" in healer.cares["GPU-x1"].note, timeout=5)  # after the hand-back
    await stays(lambda: ixsmi.runs() == [], for_=HELD_LONG_ENOUGH, message="ixsmi.runs() == []")
    assert view.devices["GPU-x1"] == UNHEALTHY


async def test_a_chip_needing_an_operator_stays_out_of_service_after_a_restart(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, conf: Path
) -> None:
    """XID 64 (an operator's) on GPU-x1 and GPU-x0 out of resets (ixsmi fails): both stay out of service across a
    restart, with no reset and no Healthy in between, until an operator returns them."""
    ixsmi.code.write_text("3")
    daemon, view = await broken_chip.started()
    broken_chip.breaks(1, 64)
    broken_chip.breaks(0, 48)
    await until(lambda: [c["phase"] for c in record_of(daemon)["chips"].values()] == ["operator", "operator"],
                timeout=15)  # fmt: skip
    assert ixsmi.runs() == ["-r -i GPU-x0"] * 3
    await daemon.shutdown()
    conf.write_text(TWO_CHIPS)  # a fresh library: it has no XIDs to tell

    again = await broken_chip.start()
    view = await kubelet.wait_registered(RESOURCE, capacity=2, timeout=10)
    assert view.devices == {"GPU-x0": UNHEALTHY, "GPU-x1": UNHEALTHY}
    await never_healthy(view, "GPU-x1", 1.0)
    assert ixsmi.runs() == ["-r -i GPU-x0"] * 3  # no reset after the start
    cares = again.node.healing.healer.cares
    assert cares["GPU-x1"].phase == "operator" and cares["GPU-x0"].phase == "operator"

    ixsmi.code.write_text("0")  # the operator fixed GPU-x0 and returns it
    broken_chip.returned_by_an_operator("GPU-x0")
    await kubelet.wait_for(lambda: view.devices["GPU-x0"] == HEALTHY, timeout=10)
    assert view.devices["GPU-x1"] == UNHEALTHY


async def test_an_unreadable_record_is_kept_aside_said_and_not_trusted(
    broken_chip: BrokenChip, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    plugins = short_dir / "plugins"
    record = record_path(plugins)
    record.parent.mkdir(parents=True)
    record.write_text('{"kind": "ix-device-plugin/node-health", "version": 1, "chips": {"GPU-x1": {"xids": 48}}}')
    daemon, view = await broken_chip.started()
    assert view.devices == {"GPU-x0": HEALTHY, "GPU-x1": HEALTHY}  # nothing of it trusted
    [aside] = [p for p in record.parent.iterdir() if p.name.startswith(f"{RECORD_FILE}.unreadable-")]
    assert "GPU-x1" in aside.read_text()
    await until(lambda: bool(node_events(apiserver, "GPUHealthRecordUnreadable")))
    [event] = node_events(apiserver, "GPUHealthRecordUnreadable")
    assert "chips.GPU-x1.xids is not a list" in event["message"] and str(record) in event["message"]
    broken_chip.breaks(0, 64)  # a good record replaces it at the next change
    await until(lambda: "GPU-x0" in record_of(daemon)["chips"])


async def test_a_reset_true_left_behind_is_ended_at_start_with_self_healing_alone(
    broken_chip: BrokenChip, apiserver: ApiServerStandIn
) -> None:
    """flags.reset_gpu off: a stop during a self-healing reset left reset: true; the next start ends it."""
    write_document(apiserver, ResetInfo(NODE, True, {OUR_NAME: False, EXPORTER: False}))
    await broken_chip.started()
    await until(lambda: not (reset_document(apiserver) or ResetInfo(NODE, True)).reset, timeout=5)
    document = reset_document(apiserver)
    assert document is not None and document.occupy == {OUR_NAME: True, EXPORTER: False}


async def test_a_chip_whose_holders_cannot_be_known_is_not_reset_and_the_event_says_why(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    _, view = await broken_chip.started(pod_resources_socket=None)
    broken_chip.breaks(1, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    await until(lambda: bool(node_events(apiserver, "GPUHealingWaiting")))
    await stays(lambda: ixsmi.runs() == [], for_=HELD_LONG_ENOUGH, message="ixsmi.runs() == []")
    [waiting] = node_events(apiserver, "GPUHealingWaiting")
    assert "waits to be reset: no one can tell whether a container holds it: " in waiting["message"]
    assert "pod-resources socket is turned off" in waiting["message"]


async def test_a_stop_with_a_slow_api_server_says_why_the_handshake_is_left_and_the_next_start_ends_it(
    broken_chip: BrokenChip,
    ixsmi: Ixsmi,
    kubelet: KubeletStandIn,
    apiserver: ApiServerStandIn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    write_document(apiserver, ResetInfo(NODE, occupy={EXPORTER: True}))  # ix-exporter never lets go
    daemon = await broken_chip.start(reset_wait_timeout=30.0)
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    broken_chip.breaks(1, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    await until(lambda: (reset_document(apiserver) or ResetInfo(NODE)).reset, timeout=5)
    apiserver.delay = 5.0  # the API server stops answering in time
    await daemon.shutdown()
    assert "could not end the GPU reset in ConfigMap" in caplog.text
    assert "the API server did not answer within" in caplog.text and "the next start ends it" in caplog.text
    apiserver.delay = 0.0
    assert (reset_document(apiserver) or ResetInfo(NODE)).reset  # left behind
    await broken_chip.start(reset_wait_timeout=30.0)
    await until(lambda: not (reset_document(apiserver) or ResetInfo(NODE, True)).reset, timeout=5)
    assert ixsmi.runs() == []


async def test_an_xid_that_needs_an_operator_seen_while_a_reset_was_on_its_way_stops_that_reset(
    broken_chip: BrokenChip, ixsmi: Ixsmi, apiserver: ApiServerStandIn, pod_resources: PodResourcesStandIn
) -> None:
    """XID 48 on a held chip: its reset waits for the pod. The pod goes, and as the healer looks whether the chip is
    free, the chip reports XID 64 (an operator's): the reset must not go on and clear it with XID 48 (the chaos
    soak's seed 1205 saw a chip so returned to service, and given to a pod, without the operator)."""
    daemon, view = await broken_chip.started()
    broken_chip.held("GPU-x1")
    broken_chip.breaks(1, 48)
    await until(lambda: bool(node_events(apiserver, "GPUHealingWaiting")))

    def xids() -> frozenset[int]:
        return next(c.status.xids for c in daemon.node.monitor.view.inventory.chips() if c.uuid == "GPU-x1")

    async def xid_64_as_it_looks() -> None:
        pod_resources.before_list = None
        broken_chip.breaks(1, 64)
        await until(lambda: 64 in xids(), 5)

    pod_resources.before_list = xid_64_as_it_looks
    broken_chip.released()  # the pod was deleted
    await until(lambda: pod_resources.before_list is None, 10)
    await stays(lambda: ixsmi.runs() == [], for_=HELD_LONG_ENOUGH, message="no reset: the chip needs an operator")
    assert view.devices["GPU-x1"] == UNHEALTHY and {48, 64} <= xids()
    assert daemon.node.healing.healer.cares["GPU-x1"].note.startswith("needs an operator")


async def test_a_kubelet_that_just_started_is_not_trusted_to_say_a_chip_is_free(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    """A kubelet answers pod-resources before it has the node's pods from the API server: the first answers after
    its start can miss a container holding the chip. Until it has run KUBELET_SETTLE seconds the holder is not
    known (a holder, then), and the chip is reset once it has."""
    just_started = PodResourcesStandIn(short_dir / "fresh" / "kubelet.sock", started_ago=KUBELET_SETTLE - 3)
    await just_started.start()
    try:
        daemon, view = await broken_chip.started(pod_resources_socket=just_started.socket_path)
        broken_chip.breaks(1, 48)
        (waiting,) = await until(lambda: node_events(apiserver, "GPUHealingWaiting"), timeout=5)
        assert "the kubelet started" in waiting["message"] and ixsmi.runs() == [], waiting
        await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=15)  # once it has run long enough
        assert ixsmi.runs() == ["-r -i GPU-x1"] and daemon.plan.by_id["GPU-x1"].healthy
    finally:
        await just_started.stop()
