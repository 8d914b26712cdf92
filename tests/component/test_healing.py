"""Self-healing in device plugin mode: an XID through the C double, `ixsmi -r` (a fake one) once no container holds the
chip, the chip Healthy again in ListAndWatch, and every step a Node Event on the API server stand-in."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest
from helpers.broken_chip import BrokenChip
from helpers.reset_support import (
    EXPORTER,
    FAST_HEALING,
    NODE,
    Ixsmi,
    exporter,
    handed_back,
    node_events,
    reset_document,
    write_document,
)
from helpers.support import RESOURCE, TWO_CHIPS, DaemonFactory, config_flags, metric
from helpers.waits import stays, until

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.gpureset import sequence
from ix_device_plugin.gpureset.sequence import OUR_NAME, ResetInfo
from ix_device_plugin.healing.events import FLUSH_INTERVAL
from ix_device_plugin.healing.operatorreturn import RETURN_ANNOTATION
from ix_device_plugin.healing.story import read_story, story_path
from ix_device_plugin.nodeagent import kit
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn


def event_writes(apiserver: ApiServerStandIn) -> int:
    return sum(1 for r in apiserver.requests if "/events" in r.path and r.method in ("POST", "PATCH"))


async def test_an_xid_on_a_free_chip_resets_that_chip_only_and_returns_it(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    daemon, view = await broken_chip.started()
    broken_chip.breaks(1, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    assert view.devices["GPU-x0"] == HEALTHY
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=10)
    assert ixsmi.runs() == ["-r -i GPU-x1"]
    assert daemon.plan.by_id["GPU-x1"].healthy
    await until(lambda: {e["reason"] for e in node_events(apiserver)} >= {"GPUXidError", "GPUUnhealthy",
                                                                      "GPUHealingReset", "GPUHealthy"})  # fmt: skip
    for reason in ("GPUXidError", "GPUUnhealthy", "GPUHealingReset", "GPUHealthy"):
        [event] = node_events(apiserver, reason)  # one Event of each step
        assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}
        assert "GPU 1 (GPU-x1)" in event["message"] and event["count"] == 1
    assert "XID 48" in node_events(apiserver, "GPUXidError")[0]["message"]
    assert "after a reset" in node_events(apiserver, "GPUHealthy")[0]["message"]
    assert node_events(apiserver, "GPUUnhealthy")[0]["type"] == "Warning"
    assert metric(daemon, "ix_device_plugin_healing_resets_total", result="ok") == 1
    assert metric(daemon, "ix_device_plugin_healing_outcomes_total", outcome="healed") == 1
    assert metric(daemon, "ix_device_plugin_gpu_out_of_service_seconds_count") == 1
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="ok") == 1
    assert handed_back(apiserver)
    await until(lambda: (read_story(story_path(daemon.options.plugin_dir)) or {}).get("chips", [{}])[1].get("note")
                == "back in service after a reset (attempt 1)")  # fmt: skip


async def test_a_chip_held_by_a_pod_waits_until_it_is_released(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    _, view = await broken_chip.started()
    await kubelet.allocate(RESOURCE, [["GPU-x1"]])
    broken_chip.held("GPU-x1")
    broken_chip.breaks(1, 63)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    await until(lambda: bool(node_events(apiserver, "GPUHealingWaiting")))
    await stays(lambda: ixsmi.runs() == [], for_=1.0, message="settle time and several looks at pod-resources")
    assert view.devices["GPU-x1"] == UNHEALTHY
    [waiting] = node_events(apiserver, "GPUHealingWaiting")
    assert "held by ml/trainer-0 (main)" in waiting["message"]
    with pytest.raises(Exception, match="Unhealthy"):
        await kubelet.allocate(RESOURCE, [["GPU-x1"]])  # nothing new lands on it meanwhile
    broken_chip.released()  # the pod was deleted
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=10)
    assert ixsmi.runs() == ["-r -i GPU-x1"]


async def test_a_failing_reset_is_retried_within_the_bound_then_needs_an_operator_who_can_return_it(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    ixsmi.code.write_text("3")
    daemon, view = await broken_chip.started()
    seen: list[str] = []
    broken_chip.breaks(0, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x0"] == UNHEALTHY, timeout=3)
    async with asyncio.timeout(10):
        while metric(daemon, "ix_device_plugin_healing_outcomes_total", outcome="needs_operator") < 1:
            seen.append(view.devices["GPU-x0"])
            await asyncio.sleep(0.02)
    assert set(seen) == {UNHEALTHY}  # never Healthy in between
    assert ixsmi.runs() == ["-r -i GPU-x0"] * 3
    assert metric(daemon, "ix_device_plugin_healing_resets_total", result="failed") == 3
    await stays(
        lambda: len(ixsmi.runs()) == 3 and view.devices["GPU-x0"] == UNHEALTHY,
        for_=FAST_HEALING.backoff_cap + 0.3,
        message="no fourth attempt",
    )
    await until(lambda: bool(node_events(apiserver, "GPUNeedsOperator")))
    [needs] = node_events(apiserver, "GPUNeedsOperator")
    assert "3 resets failed" in needs["message"] and "exited with code 3" in needs["message"]
    assert f"{RETURN_ANNOTATION}=GPU-x0" in needs["message"]
    assert len(node_events(apiserver, "GPUHealingFailed")) == 3

    ixsmi.code.write_text("0")  # the operator fixed it; the agent is not restarted
    broken_chip.returned_by_an_operator("GPU-x0")
    await kubelet.wait_for(lambda: view.devices["GPU-x0"] == HEALTHY, timeout=10)
    assert ixsmi.runs() == ["-r -i GPU-x0"] * 4
    await until(lambda: bool(node_events(apiserver, "GPUReturnRequested")))


async def test_an_xid_storm_of_one_kind_is_one_event_with_a_count(
    broken_chip: BrokenChip, apiserver: ApiServerStandIn
) -> None:
    daemon, _ = await broken_chip.started()
    broken_chip.held("GPU-x1")  # it waits: no reset mid-storm
    broken_chip.breaks(1, 94, times=100)
    await until(lambda: metric(daemon, "ix_device_plugin_xid_events_total", xid="94") == 100, timeout=20)
    await until(lambda: [e.get("count") for e in node_events(apiserver, "GPUXidError")] == [100], timeout=15)
    writes = event_writes(apiserver)
    distinct = len(node_events(apiserver))  # the XID, the health change, the wait
    assert writes <= distinct + 3, f"{writes} API writes for {distinct} Events of 100 XIDs"


def xid_series(daemon: Daemon) -> dict[str, float]:
    """ix_device_plugin_xid_events_total by its xid label."""
    return {
        sample.labels["xid"]: sample.value
        for family in daemon.metrics.registry.collect()
        for sample in family.samples
        if sample.name == "ix_device_plugin_xid_events_total"
    }


async def test_thousands_of_distinct_xids_on_one_chip_keep_event_writes_and_metric_series_bounded(
    broken_chip: BrokenChip, apiserver: ApiServerStandIn
) -> None:
    daemon, _ = await broken_chip.started()
    broken_chip.held("GPU-x1")  # it waits: no reset mid-storm
    started = time.monotonic()
    broken_chip.breaks(1, 48)
    for xid in range(1000, 3000):
        broken_chip.breaks(1, xid)
    broken_chip.breaks(1, 79)  # needs an operator: an Event of its own, not lost in the storm
    await until(lambda: sum(xid_series(daemon).values()) == 2002, timeout=60)
    assert xid_series(daemon) == {"48": 1, "other": 2000, "79": 1}
    await until(lambda: sorted(e.get("count") for e in node_events(apiserver, "GPUXidError")) == [1, 2001],
                timeout=15)  # fmt: skip
    took = time.monotonic() - started
    by_count = {e["count"]: e["message"] for e in node_events(apiserver, "GPUXidError")}
    fell_off = "XID 79 (the chip fell off the bus: the node needs a reboot)"
    assert by_count[1] == f"GPU 1 (GPU-x1): {fell_off}: needs an operator"
    assert by_count[2001].endswith("GPU 1 (GPU-x1): XID 2999: a reset clears it")
    writes, distinct = event_writes(apiserver), len(node_events(apiserver))
    patches = 2 * (int(took // FLUSH_INTERVAL) + 1)  # each of the chip's two XID Events, once per flush interval
    assert writes <= distinct + patches, f"{writes} API writes for {distinct} Events of 2,002 XIDs in {took:.0f}s"
    assert metric(daemon, "ix_device_plugin_node_events_dropped_total") == 0


async def test_a_stop_during_healing_is_prompt_and_leaves_the_handshake_as_others_expect(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    write_document(apiserver, ResetInfo(NODE, occupy={EXPORTER: True}))
    seen: list[tuple[bool, dict[str, bool]]] = []
    holding = asyncio.create_task(exporter(apiserver, seen, lets_go=False))  # ix-exporter does not let go
    try:
        daemon = await broken_chip.start(reset_wait_timeout=30.0)
        view = await kubelet.wait_registered(RESOURCE, capacity=2)
        broken_chip.breaks(1, 48)
        await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
        await until(lambda: (reset_document(apiserver) or ResetInfo(NODE)).reset, timeout=5)  # asking it to let go
        started = time.monotonic()
        await daemon.shutdown()
        assert time.monotonic() - started < 2.0
    finally:
        holding.cancel()
    document = reset_document(apiserver)
    assert document is not None and document.reset is False
    assert document.occupy == {OUR_NAME: True, EXPORTER: True}
    assert ixsmi.runs() == []
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="cancelled") == 1  # called off: no failure
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="failed") == 0


async def test_a_stop_while_ixsmi_runs_waits_for_it_and_says_the_reset_is_over(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    ixsmi.delay.write_text("1")
    daemon, view = await broken_chip.started()
    broken_chip.breaks(1, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    await until(lambda: ixsmi.runs() != [], timeout=5)
    started = time.monotonic()
    await daemon.shutdown()
    assert time.monotonic() - started < 2.5  # ixsmi's second, then the hand-back: a chip is never left half reset
    assert handed_back(apiserver)


async def test_a_stop_while_ixsmi_hangs_kills_it_after_the_wait_and_counts_the_reset_cancelled(
    broken_chip: BrokenChip,
    ixsmi: Ixsmi,
    kubelet: KubeletStandIn,
    apiserver: ApiServerStandIn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sequence, "RESET_STOP_WAIT", 1.0)  # the README's 10 s, shortened
    monkeypatch.setattr(kit, "RESET_STOP_WAIT", 1.0)
    ixsmi.delay.write_text("60")
    daemon, view = await broken_chip.started(reset_timeout=120.0)
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="cancelled") == 0  # there from the start
    assert 'ix_device_plugin_gpu_resets_total{result="cancelled"} 0.0' in daemon.metrics.render().decode()
    broken_chip.breaks(1, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    await until(lambda: ixsmi.runs() != [], timeout=5)
    started = time.monotonic()
    await daemon.shutdown()
    took = time.monotonic() - started
    assert 1.0 <= took < 1.0 + sequence.KILL_WAIT + daemon.options.stop_timeout, took
    assert handed_back(apiserver)
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="cancelled") == 1
    assert metric(daemon, "ix_device_plugin_gpu_resets_total", result="failed") == 0
    assert metric(daemon, "ix_device_plugin_healing_resets_total", result="failed") == 0


async def test_without_api_access_auto_leaves_the_chip_out_and_says_why(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    daemon = await start_daemon(**broken_chip.over_double())
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    broken_chip.breaks(1, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == UNHEALTHY, timeout=3)
    await stays(lambda: ixsmi.runs() == [], for_=0.6, message="ixsmi.runs() == []")
    story = read_story(story_path(daemon.options.plugin_dir))
    assert story is not None and story["self_healing"].startswith("off (no API access")
    assert story["chips"][1]["phase"] == "off" and story["chips"][1]["causes"] == ["XID 48"]


async def test_self_healing_true_resets_without_api_access(
    broken_chip: BrokenChip,
    ixsmi: Ixsmi,
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    pod_resources: PodResourcesStandIn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="ix_device_plugin")
    await start_daemon(
        **broken_chip.over_double(),
        given=config_flags(self_healing="true"),
        pod_resources_socket=pod_resources.socket_path,
    )
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    broken_chip.breaks(0, 48)
    await kubelet.wait_for(lambda: view.devices["GPU-x0"] == UNHEALTHY, timeout=3)
    await kubelet.wait_for(lambda: view.devices["GPU-x0"] == HEALTHY, timeout=10)
    assert ixsmi.runs() == ["-r -i GPU-x0"]
    said = [r.getMessage() for r in caplog.records if "without API access" in r.getMessage()]
    assert said == [
        "self-healing (health.selfHealing: true) resets GPUs without API access (NODE_NAME and a service account or "
        "kubeconfig): other IXML users such as ix-exporter are not asked to let go before a reset"
    ]  # not flags.reset_gpu, which is off


async def test_an_operator_error_is_not_reset_and_a_health_error_that_stays_fails_the_attempt(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, conf: Path
) -> None:
    conf.write_text(TWO_CHIPS.replace("minor=1 ", "minor=1 health=0x10 "))  # ECC on GPU-x1, which no reset clears
    daemon, view = await broken_chip.started()
    broken_chip.breaks(0, 79)  # fallen off the bus: an operator's
    await until(lambda: metric(daemon, "ix_device_plugin_healing_outcomes_total", outcome="needs_operator") == 2,
                timeout=15)  # fmt: skip
    assert ixsmi.runs() == ["-r -i GPU-x1"] * 3
    assert view.devices["GPU-x0"] == UNHEALTHY and view.devices["GPU-x1"] == UNHEALTHY
    assert metric(daemon, "ix_device_plugin_healing_resets_total", result="still_unhealthy") == 3

    def phases() -> list[str]:  # the story is written after the outcome is counted
        path = story_path(daemon.options.plugin_dir)
        return [chip["phase"] for chip in json.loads(path.read_text())["chips"]] if path.exists() else []

    await until(lambda: phases() == ["operator", "operator"], timeout=5)
    story = json.loads(story_path(daemon.options.plugin_dir).read_text())
    assert "still unhealthy after the reset: ECC" in story["chips"][1]["note"]
    conf.write_text(TWO_CHIPS)  # the ECC error cleared by itself: GPU-x1 is back; GPU-x0 keeps its XID
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=5)
    assert view.devices["GPU-x0"] == UNHEALTHY
