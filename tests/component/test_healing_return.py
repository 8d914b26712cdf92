"""An operator's return vouches for what the chip had when they asked, not for a fault that came after (device plugin
mode): an error that needs an operator, reported while the return's reset waits, stops that reset, also when the
agent restarts in between (the node-health record keeps what the return covered, `returnedFor`)."""

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
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn

CHIP = "GPU-x1"
HOLDER = {("ml", "trainer-0"): {"main": {RESOURCE: [CHIP]}}}


async def test_an_operator_xid_after_the_return_keeps_the_chip_out_across_a_restart(
    broken_chip: BrokenChip,
    ixsmi: Ixsmi,
    kubelet: KubeletStandIn,
    apiserver: ApiServerStandIn,
    pod_resources: PodResourcesStandIn,
    short_dir: Path,
) -> None:
    """XID 48 on GPU 1 and its resets fail: it needs an operator, who returns it while a pod holds it; the return's
    reset waits for the pod. Meanwhile the chip reports XID 64 (an operator's), and the agent restarts. Once the pod
    is gone, the reset the return asked for must not run and clear XID 64 with XID 48 (a soak saw a chip so back in
    service): the chip waits for an operator again, and their next return brings it back."""
    ixsmi.code.write_text("3")
    first, view = await broken_chip.started()
    broken_chip.breaks(1, 48)
    await until(lambda: recorded(short_dir, CHIP).get("phase") == "operator", timeout=15)
    tried = len(ixsmi.runs())

    ixsmi.code.write_text("0")  # the operator fixed it, and returns it while a pod holds it
    pod_resources.pods = dict(HOLDER)
    broken_chip.returned_by_an_operator(CHIP)
    await until(lambda: recorded(short_dir, CHIP).get("returnedFor") == ["XID 48"], timeout=10)
    broken_chip.breaks(1, 64)
    # heard though the failed resets let go of the library: the next health poll waits for XIDs again
    await until(lambda: 64 in recorded(short_dir, CHIP).get("xids", []), timeout=10)
    await first.shutdown()
    shutil.rmtree(short_dir / "dev")  # made again by the next start

    again, view = await broken_chip.started()
    pod_resources.pods = {}  # the pod is gone: the chip is free
    await until(lambda: recorded(short_dir, CHIP).get("phase") == "operator", timeout=10)
    await stays(lambda: len(ixsmi.runs()) == tried and view.devices[CHIP] == UNHEALTHY, for_=1.0, message="no reset")
    assert again.node.healing.healer.cares[CHIP].phase == "operator"
    said = [e["message"] for e in node_events(apiserver, "GPUNeedsOperator")]
    assert any("needs an operator: XID 64 reported since an operator asked to return it" in m for m in said), said

    node = apiserver.get("nodes", NODE)  # the operator looked again: a new return (the annotation named it already)
    assert node is not None
    del node["metadata"]["annotations"][RETURN_ANNOTATION]
    apiserver.put("nodes", node)
    broken_chip.returned_by_an_operator(CHIP)
    await kubelet.wait_for(lambda: view.devices[CHIP] == HEALTHY, timeout=10)
    assert len(ixsmi.runs()) == tried + 1
