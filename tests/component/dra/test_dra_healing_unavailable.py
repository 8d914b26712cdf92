"""Self-healing in DRA mode where no reset can work (--reset-via none): the chip's devices stay tainted, one
GPUResetUnavailable Event says what is missing, nothing is asked of the other IXML users, and an operator who reset
it by hand returns it: the taint goes."""

from __future__ import annotations

from helpers.dra_support import DraNode
from helpers.reset_support import FAST_HEALING, node_events
from helpers.waits import stays, until
from test_dra_healing import tainted, uuid_of, with_xid

from ix_device_plugin.gpureset.sequence import DATA_KEY, ResetInfo
from ix_device_plugin.healing.operatorreturn import RETURN_ANNOTATION
from ix_device_plugin.standins.apiserver import ApiServerStandIn

UNAVAILABLE = "GPUResetUnavailable"


def said_reset(api: ApiServerStandIn) -> bool:
    """True when a write of the handshake's ConfigMap said `reset: true` (asked the other IXML users to let go)."""
    writes = [r.body for r in api.requests if "/configmaps" in r.path and r.method in ("POST", "PUT", "PATCH")]
    return any(ResetInfo.parse((body.get("data") or {}).get(DATA_KEY), "").reset for body in writes if body)


async def test_with_no_reset_path_the_chip_stays_tainted_until_returned_by_hand(
    node: DraNode, api: ApiServerStandIn
) -> None:
    await node.start(reset_via="none", healing_rules=FAST_HEALING)  # the simulated chips, as the options build them
    await node.wait_slice(lambda devices: len(devices) == 6)
    chip = uuid_of(node, "gpu-1")
    node.write_boards(with_xid(48))
    await node.wait_slice(lambda devices: tainted(devices, "gpu-1") and tainted(devices, "board-0"))
    await until(lambda: node_events(api, UNAVAILABLE), message="a GPUResetUnavailable Event")

    def left_alone() -> bool:
        return (
            tainted(node.slice_devices(), "gpu-1") and not said_reset(api) and not node_events(api, "GPUHealingReset")
        )

    await stays(left_alone, for_=1.0, message="still tainted, no handshake, no reset")
    [event] = node_events(api, UNAVAILABLE)
    assert event["message"].startswith(f"GPU 1 ({chip}) cannot be reset here: no reset path is given to the agent")
    assert "resetHelper.enabled" in event["message"] and "privileged: true" in event["message"]
    assert node_events(api, "GPUNeedsOperator") == [] and node_events(api, "GPUHealingFailed") == []

    stored = api.get("nodes", node.node)
    assert stored is not None
    stored["metadata"].setdefault("annotations", {})[RETURN_ANNOTATION] = chip
    api.put("nodes", stored)
    await node.wait_slice(lambda devices: not tainted(devices, "gpu-1") and not tainted(devices, "board-0"), timeout=10)
    assert not said_reset(api)
    assert len(node_events(api, UNAVAILABLE)) == 1
