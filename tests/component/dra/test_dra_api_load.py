"""The DRA driver's API requests while a chip waits: a chip with an XID that a claim holds is looked at every second
until it is free, and a look that finds it held costs no API request (no ResourceSlice read or write) and no write
of the node-health record."""

from __future__ import annotations

from helpers.dra_support import DraNode
from helpers.reset_support import FAST_HEALING, Ixsmi, IxsmiBackend
from helpers.waits import stays, until

from ix_device_plugin.healing.record import record_path
from ix_device_plugin.settings.config import Config
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


def slice_lists(api: ApiServerStandIn) -> int:
    return sum(
        1
        for r in api.requests
        if r.method == "GET" and r.path.endswith("/resourceslices") and r.query.get("watch") not in ("1", "true")
    )


def slice_writes(api: ApiServerStandIn) -> int:
    return sum(1 for r in api.requests if r.method in ("PUT", "POST") and "/resourceslices" in r.path)


async def test_a_chip_out_of_service_and_back_is_published_without_reading_the_slices_again(
    node: DraNode, api: ApiServerStandIn
) -> None:
    """Each health change is a write over the slices last published: no list of them before it, and none after it
    when the watch shows the driver's own writes (even while it is a write behind). The first one, which learns
    whether the API server keeps device taints, reads them once."""
    ixsmi = Ixsmi(node.root)
    # Three faults of one chip, each reset: no reset limit (the default leaves the third to an operator).
    await node.start(
        backend_factory=lambda: IxsmiBackend(node.devices_file, ixsmi.path),
        healing_rules=FAST_HEALING,
        config=Config(reset_limit=0),
    )
    await node.wait_slice(lambda devices: len(devices) == 6)
    await xid_reset_and_back(node, ixsmi, 48, resets=1)
    lists, writes = slice_lists(api), slice_writes(api)
    await xid_reset_and_back(node, ixsmi, 94, resets=2)
    await xid_reset_and_back(node, ixsmi, 95, resets=3)
    await stays(lambda: slice_lists(api) == lists, for_=1.0, message="no list of the slices for the writes")
    assert slice_writes(api) >= writes + 4  # tainted and back, twice (two slices each: the boards' and the chips')


async def xid_reset_and_back(node: DraNode, ixsmi: Ixsmi, xid: int, resets: int) -> None:
    """GPU 1 reports xid (one the simulated chip has not sent yet), is tainted, reset and back untainted."""
    node.write_boards([{"product": "BI-V150", "chips": [None, {"xids": [xid]}]}, {"product": "BI-V150"}])
    await node.wait_slice(lambda devices: "taints" in devices.get("gpu-1", {}))
    await until(lambda: len(ixsmi.runs()) >= resets, timeout=10)
    node.write_boards([{"product": "BI-V150"}, {"product": "BI-V150"}])
    await node.wait_slice(lambda devices: all("taints" not in d for d in devices.values()), timeout=10)
