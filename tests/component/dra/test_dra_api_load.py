"""The DRA driver's API requests while a chip waits: a chip with an XID that a claim holds is looked at every second
until it is free, and a look that finds it held costs no API request (no ResourceSlice read or write) and no write
of the node-health record."""

from __future__ import annotations

from helpers.dra_support import DraNode
from helpers.reset_support import FAST_HEALING, Ixsmi, IxsmiBackend
from helpers.waits import stays, until

from ix_device_plugin.healing.record import record_path
from ix_device_plugin.standins.apiserver import ApiServerStandIn

LOOKS_S = 3.5  # three looks of the healer at the held chip (one a second)
XID_ON_GPU_1 = [{"product": "BI-V150", "chips": [None, {"xids": [48]}]}, {"product": "BI-V150"}]


def slice_reads(api: ApiServerStandIn) -> int:
    return sum(1 for r in api.requests if r.method == "GET" and r.path.endswith("/resourceslices"))


async def test_a_held_chip_waiting_for_its_reset_costs_no_request_per_look(
    node: DraNode, api: ApiServerStandIn
) -> None:
    ixsmi = Ixsmi(node.root)
    driver = await node.start(
        backend_factory=lambda: IxsmiBackend(node.devices_file, ixsmi.path), healing_rules=FAST_HEALING
    )
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("held", ["gpu-1"])
    assert (await kubelet.prepare([claim])).claims[claim[2]].error == ""
    node.write_boards(XID_ON_GPU_1)
    await node.wait_slice(lambda devices: "taints" in devices.get("gpu-1", {}))
    record = record_path(node.root / "plugins")
    await until(record.exists, timeout=5)
    cares = driver.node.healing.healer.cares
    await until(lambda: any("held by" in care.note for care in cares.values()), timeout=5)
    # The chip found held is said once (its record written, its slice published again); that settles first.
    seen: list[tuple[int, int]] = []
    await until(lambda: seen.append((slice_reads(api), record.stat().st_mtime_ns)) or seen[-2:] == seen[-1:] * 2,
                timeout=10, interval=0.5)  # fmt: skip
    reads, written = seen[-1]
    await stays(
        lambda: slice_reads(api) == reads and record.stat().st_mtime_ns == written,
        for_=LOOKS_S,
        message="no slice read and no record write while the chip stays held",
    )
    assert ixsmi.runs() == []
    await kubelet.close()
