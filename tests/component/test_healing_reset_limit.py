"""Self-healing's reset limit in device plugin mode: a chip healed twice (the default health.resetLimit) within the
window is left to an operator at its third fault, with one GPUResetLimitReached Event; its history is in the
node-health record, so a restart in between changes nothing; the operator's return resets it and clears the history."""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers.broken_chip import BrokenChip
from helpers.reset_support import NODE, Ixsmi, node_events
from helpers.support import RESOURCE
from helpers.waits import stays, until
from test_health_record import recorded

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.healing.operatorreturn import RETURN_ANNOTATION
from ix_device_plugin.healing.telling import RESET_LIMIT_REACHED
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

CHIP = "GPU-x1"


async def fault_and_heal(broken_chip: BrokenChip, resets: int) -> None:
    """An XID 48 on GPU 1, which is reset (its resets-th) and back in service."""
    view = await broken_chip.kubelet.wait_registered(RESOURCE, capacity=2)
    broken_chip.breaks(1, 48)
    await until(lambda: len(broken_chip.ixsmi.runs()) == resets, timeout=10)
    await broken_chip.kubelet.wait_for(lambda: view.devices[CHIP] == HEALTHY, timeout=10)


async def test_a_chip_reset_twice_is_left_to_an_operator_at_its_third_fault_across_a_restart(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    first = await broken_chip.start()
    await fault_and_heal(broken_chip, resets=1)
    await fault_and_heal(broken_chip, resets=2)
    await until(lambda: len(recorded(short_dir, CHIP).get("resets", [])) == 2, timeout=5)
    assert recorded(short_dir, CHIP)["phase"] == "healthy"
    await first.shutdown()  # a restart: the history is the record's
    shutil.rmtree(short_dir / "dev")  # made again by the next start

    _, view = await broken_chip.started()
    await kubelet.wait_for(lambda: view.devices[CHIP] == HEALTHY, timeout=10)
    broken_chip.breaks(1, 48)  # the third fault within the window
    await kubelet.wait_for(lambda: view.devices[CHIP] == UNHEALTHY, timeout=5)
    await until(lambda: bool(node_events(apiserver, RESET_LIMIT_REACHED)), timeout=5)
    await stays(lambda: len(ixsmi.runs()) == 2 and view.devices[CHIP] == UNHEALTHY, for_=1.0, message="not reset")
    [limited] = node_events(apiserver, RESET_LIMIT_REACHED)
    assert limited["type"] == "Warning"
    assert limited["message"] == (
        f"GPU 1 ({CHIP}): reset 2 times within 24h: not reset again automatically; once it is fixed, return it: "
        f"kubectl annotate --overwrite node {NODE} {RETURN_ANNOTATION}={CHIP}"
    )
    assert node_events(apiserver, "GPUNeedsOperator") == []  # its own reason, not both
    entry = recorded(short_dir, CHIP)
    assert entry["phase"] == "operator" and entry["resetLimitReached"] is True and len(entry["resets"]) == 2

    broken_chip.returned_by_an_operator(CHIP)  # reset once more, and the history starts again
    await kubelet.wait_for(lambda: view.devices[CHIP] == HEALTHY, timeout=10)
    assert len(ixsmi.runs()) == 3
    await until(lambda: recorded(short_dir, CHIP) == {}, timeout=5)  # healthy, with no reset to remember
    await fault_and_heal(broken_chip, resets=4)  # a fault after the return is healed again
    assert len(node_events(apiserver, RESET_LIMIT_REACHED)) == 1


async def test_a_pod_that_comes_to_act_for_the_node_says_again_what_waits_for_an_operator(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    """Soak seed 176345 (DRA): a chip reached its reset limit as the API server restarted, and the agent was killed
    0.3 s after the server was back: its GPUResetLimitReached Event never reached the server, and the next process,
    reading the chip's state from the record, said nothing. A process that comes to act for the node says again, once,
    what waits for an operator."""
    first = await broken_chip.start()
    await fault_and_heal(broken_chip, resets=1)
    await fault_and_heal(broken_chip, resets=2)
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    broken_chip.breaks(1, 48)  # the third fault: left to an operator
    await until(lambda: bool(node_events(apiserver, RESET_LIMIT_REACHED)), timeout=5)
    await until(lambda: recorded(short_dir, CHIP).get("phase") == "operator", timeout=5)
    await first.shutdown()
    for event in node_events(apiserver):  # what the API server never heard
        apiserver.delete("events", event["metadata"]["name"], event["metadata"]["namespace"])
    shutil.rmtree(short_dir / "dev")

    _, view = await broken_chip.started()
    await until(lambda: len(node_events(apiserver, RESET_LIMIT_REACHED)) == 1, timeout=5)
    [said] = node_events(apiserver, RESET_LIMIT_REACHED)
    assert said["message"].startswith(f"GPU 1 ({CHIP}): reset 2 times within 24h: not reset again automatically")
    await stays(lambda: len(ixsmi.runs()) == 2 and view.devices[CHIP] == UNHEALTHY, for_=1.0, message="not reset")
    assert node_events(apiserver, "GPUUnhealthy") == []  # no new fault: only what still waits
