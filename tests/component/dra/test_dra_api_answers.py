"""What the API server says is taken from its own answers and checked again, never assumed for good: the counters
it keeps, the Node that owns the slices, slices another writer changed, and the order of claim status writes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from helpers.dra_support import TWO_BOARDS, DraNode, answer
from helpers.waits import stays, until

from ix_device_plugin.dra import publisher
from ix_device_plugin.dra.pool import MANAGED_BY, slice_base_name
from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.apiserver import ApiServerStandIn

CHIPS = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
BROKEN_CHIP = [{"product": "BI-V150"}, {"product": "BI-V150", "chips": [None, {"health": ["ECC"]}]}]


def slice_writes(api: ApiServerStandIn) -> list[str]:
    """The ResourceSlice writes the driver made (dry runs aside), as `METHOD path`."""
    return [
        f"{r.method} {r.path}"
        for r in api.requests
        if "/resourceslices" in r.path and r.method in ("POST", "PUT", "DELETE") and r.query.get("dryRun") != "All"
    ]


def written_devices(api: ApiServerStandIn) -> list[list[str]]:
    """The device names of each write of a slice of devices the driver made (dry runs aside), in order."""
    return [
        sorted(d["name"] for d in r.body["spec"]["devices"])
        for r in api.requests
        if "/resourceslices" in r.path
        and r.method in ("POST", "PUT")
        and r.query.get("dryRun") != "All"
        and "devices" in r.body["spec"]
    ]


def owners(api: ApiServerStandIn) -> list[list[str]]:
    """The owner UIDs of each stored slice."""
    return [[o["uid"] for o in s["metadata"].get("ownerReferences") or []] for s in api.objects("resourceslices")]


@pytest.fixture
def quick_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counters asked about again after 0.2 s, then at most every 0.4 s."""
    monkeypatch.setattr(publisher, "RECHECK_FIRST", 0.2, raising=False)
    monkeypatch.setattr(publisher, "RECHECK_CAP", 0.4, raising=False)


# ---- the counters capability -------------------------------------------------------------------------------


async def test_a_422_for_another_field_keeps_the_boards_and_is_retried(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    api.refuse_writes("resourceslices", "metadata.annotations", "Invalid value: refused by a policy", times=2)
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)  # the boards too, once the refusal is over
    assert driver.publisher is not None and driver.publisher.counters is True
    refused = [r.getMessage() for r in caplog.records if "refuses metadata.annotations" in r.getMessage()]
    assert refused and "retrying" in refused[0]
    assert "refuses shared counters" not in caplog.text


@pytest.mark.parametrize("server", ["refuses", "drops"])
async def test_a_server_without_counters_is_asked_again_and_gets_the_boards_when_it_keeps_them(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture, quick_recheck: None, server: str
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin.dra")
    if server == "refuses":
        api.counters_refused = True  # a 422 whose causes name spec.sharedCounters and the devices' consumesCounters
    else:
        api.shared_counters = False  # the fields dropped on write (DRAPartitionableDevices off)
    driver = await node.start()
    await until(lambda: driver.publisher is not None and driver.publisher.counters is False)
    await until(lambda: len(api.objects("resourceslices")) == 1)  # no counter slice
    await node.wait_slice(lambda devices: sorted(devices) == CHIPS)
    writes = len(slice_writes(api))
    await stays(
        lambda: len(slice_writes(api)) == writes,
        for_=1.0,
        message="asked again, by dry runs only: no write while the answer is the same",
    )
    assert any(r.query.get("dryRun") == "All" for r in api.requests)
    written = len(written_devices(api))
    api.counters_refused, api.shared_counters = False, True  # the server upgraded (or its feature gate on)
    await node.wait_slice(lambda devices: len(devices) == 6, timeout=5)
    assert driver.publisher is not None and driver.publisher.counters is True
    await until(
        lambda: written_devices(api)[written:] == [sorted([*CHIPS, "board-0", "board-2"])],
        timeout=5,
        message="the boards with the counters",
    )
    said = "refuses shared counters (spec." if server == "refuses" else "drops shared counters"
    assert said in caplog.text and "keeps shared counters now" in caplog.text


# ---- the first write is the right one ------------------------------------------------------------------------

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CREATES = [f"POST {SLICES}", f"POST {SLICES}"]  # the devices, the boards' counter sets


@pytest.mark.parametrize(
    ("server", "boards", "devices", "writes"),
    [
        ("keeps counters", TWO_BOARDS, [*CHIPS, "board-0", "board-2"], CREATES),
        ("drops counters", TWO_BOARDS, CHIPS, CREATES[:1]),
        ("refuses counters", TWO_BOARDS, CHIPS, CREATES[:1]),
        ("keeps taints", BROKEN_CHIP, [*CHIPS, "board-0", "board-2"], CREATES),
        ("drops taints", BROKEN_CHIP, ["gpu-0", "gpu-1", "gpu-2", "board-0"], CREATES),
    ],
)
async def test_a_new_node_writes_each_slice_once_and_its_first_write_is_the_right_one(
    node: DraNode,
    api: ApiServerStandIn,
    server: str,
    boards: list[dict[str, Any]],
    devices: list[str],
    writes: list[str],
) -> None:
    """Where the server keeps counters, the boards are in the first write; where it drops or refuses them, chips
    only; an unhealthy chip is tainted, or left out where taints are dropped, from the first write on."""
    api.shared_counters = server != "drops counters"
    api.counters_refused = server == "refuses counters"
    api.device_taints = server != "drops taints"
    node.write_boards(boards)
    await node.start(config=Config(self_healing="false"))  # a reset's word (the healing taint) is a write too
    await node.wait_slice(lambda stored: sorted(stored) == sorted(devices))
    await stays(lambda: slice_writes(api) == writes, for_=0.5, message="anything written again would be by now")
    assert written_devices(api) == [sorted(devices)]


async def test_a_new_node_with_shared_chips_asks_nothing_before_its_write(node: DraNode, api: ApiServerStandIn) -> None:
    """Shared devices need no dry run on a new node: a server that drops allowMultipleAllocations stores what the
    driver would write knowing it."""
    api.consumable_capacity = False
    driver = await node.start(config=Config(splitboard=True, replicas=4))
    await node.wait_slice(lambda devices: sorted(devices) == CHIPS)
    await stays(
        lambda: not [r for r in api.requests if r.query.get("dryRun") == "All"],
        for_=0.3,
        message='not [r for r in api.requests if r.query.get("dryRun") == "All"]',
    )
    assert slice_writes(api) == CREATES[:1] and driver.publisher is not None and driver.publisher.sharing is False


@pytest.mark.parametrize("server", ["drops counters", "drops taints", "drops sharing"])
async def test_a_restart_on_a_server_that_drops_a_field_writes_nothing(
    node: DraNode, api: ApiServerStandIn, server: str
) -> None:
    """The slices an earlier run stored as the server keeps them are not written again at a restart."""
    api.shared_counters = server != "drops counters"
    api.device_taints = server != "drops taints"
    api.consumable_capacity = server != "drops sharing"
    node.write_boards(BROKEN_CHIP if server == "drops taints" else TWO_BOARDS)
    config = {"config": Config(splitboard=True, replicas=4)} if server == "drops sharing" else {}
    driver = await node.start(**config)
    await until(lambda: driver.publisher is not None and driver.publisher.published is not None)
    await asyncio.sleep(0.3)
    await node.stop(driver)
    writes = len(slice_writes(api))
    driver = await node.start(**config)
    await until(lambda: driver.publisher is not None and driver.publisher.published is not None)
    await stays(lambda: slice_writes(api)[writes:] == [], for_=0.3, message="slice_writes(api)[writes:] == []")


# ---- the Node that owns the slices ---------------------------------------------------------------------------


async def test_a_node_re_created_owns_its_slices_again_without_a_write_loop(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin.dra")
    await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    old = api.get("nodes", node.node)["metadata"]["uid"]  # type: ignore[index]
    assert owners(api) == [[old], [old]]
    await api.watching("nodes")
    await api.watching("resourceslices")
    api.delete("nodes", node.node)
    new = api.add_node(node.node)["metadata"]["uid"]  # the garbage collector deletes what the old UID owns
    await until(lambda: owners(api) == [[new], [new]])
    await asyncio.sleep(0.5)
    writes = len(slice_writes(api))
    await stays(lambda: slice_writes(api)[writes:] == [], for_=2.0, message="settled: no create, delete, create...")
    assert owners(api) == [[new], [new]] and len(node.slice_devices()) == 6
    assert f"was re-created (UID {new}, was {old})" in caplog.text


async def test_a_node_missing_at_start_owns_the_slices_once_it_appears(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin.dra")
    api.delete("nodes", node.node)
    await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    assert owners(api) == [[], []]
    assert f"node {node.node} not found" in caplog.text
    uid = api.add_node(node.node)["metadata"]["uid"]
    await until(lambda: owners(api) == [[uid], [uid]])
    await stays(
        lambda: owners(api) == [[uid], [uid]], for_=0.3, message="and kept: the garbage collector finds the owner there"
    )


# ---- slices another writer changed ---------------------------------------------------------------------------


async def test_a_slice_whose_label_another_writer_removed_is_adopted_and_kept_current(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    await api.watching("resourceslices")
    stored = node.slice()
    assert stored is not None
    stored["metadata"]["labels"] = {}
    api.put("resourceslices", stored)
    await until(lambda: (node.slice() or {}).get("metadata", {}).get("labels") == MANAGED_BY, timeout=3)
    assert "had lost its label app.kubernetes.io/managed-by=ix-device-plugin" in caplog.text
    node.write_boards(BROKEN_CHIP)  # a health change reaches the adopted slice
    await node.wait_slice(lambda devices: "taints" in devices["gpu-3"], timeout=3)
    assert "still conflicting" not in caplog.text
    assert driver.publisher is not None and driver.publisher.repairs >= 1


async def test_the_slice_name_held_by_this_drivers_unlabelled_slice_on_the_node_is_adopted(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    name = slice_base_name(node.node)
    spec = {
        "driver": DRIVER,
        "nodeName": node.node,
        "pool": {"name": "elsewhere", "generation": 3, "resourceSliceCount": 1},
        "devices": [{"name": "nic-0"}],
    }
    api.put("resourceslices", {"apiVersion": "resource.k8s.io/v1", "metadata": {"name": name}, "spec": spec})
    await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    stored = node.slice()
    assert stored is not None and stored["metadata"]["labels"] == MANAGED_BY
    assert stored["spec"]["pool"]["name"] == node.node
    found = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"ResourceSlice {name}")]
    assert found and "adopted" in found[0] and "'elsewhere'" in found[0]


@pytest.mark.parametrize("held_by", ["another driver", "this driver, another node"])
async def test_names_held_by_slices_not_the_pools_are_left_to_them_and_the_pool_takes_the_next_free_ones(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture, held_by: str
) -> None:
    """A name squatted before the driver starts (another node's token under an older release's policy, which did not
    pin slice names): the driver does not delete that slice (the policy forbids it, so it would be refused for
    ever), it publishes under the next free names, within seconds, and says so once per name."""
    base = slice_base_name(node.node)
    squatted = [base, f"{base}-1"]
    spec = {
        "driver": "net.example.com" if held_by == "another driver" else DRIVER,
        "nodeName": "node-b" if held_by == "this driver, another node" else node.node,
        "pool": {"name": "node-b", "generation": 3, "resourceSliceCount": 1},
        "devices": [{"name": "nic-0"}],
    }
    for name in squatted:
        api.put("resourceslices", {"apiVersion": "resource.k8s.io/v1", "metadata": {"name": name}, "spec": spec})
    driver = await node.start()

    def published() -> dict[str, Any] | None:
        return api.get("resourceslices", f"{base}-2")

    await until(lambda: len((published() or {}).get("spec", {}).get("devices", [])) == 6, timeout=5)
    stored = published()
    assert stored is not None and stored["spec"]["pool"]["name"] == node.node
    assert stored["metadata"]["labels"] == MANAGED_BY
    for name in squatted:  # left as they were
        assert (api.get("resourceslices", name) or {}).get("spec") == spec
    assert not [r for r in api.requests if r.method == "DELETE" and "/resourceslices/" in r.path]
    node.write_boards(BROKEN_CHIP)  # and kept current there
    await until(lambda: "taints" in {d["name"]: d for d in published()["spec"]["devices"]}["gpu-3"], timeout=5)
    said = [r.getMessage() for r in caplog.records if "is held by a slice that is not the pool's" in r.getMessage()]
    assert sorted(message.split(",")[0] for message in said) == [f"ResourceSlice {name}" for name in squatted]
    assert f"driver {spec['driver']!r}" in said[0] and "'node-b'" in said[0]
    assert driver.publisher is not None


# ---- claim status writes -------------------------------------------------------------------------------------


def status_patches(api: ApiServerStandIn, name: str) -> int:
    return sum(1 for r in api.requests if r.method == "PATCH" and r.path.endswith(f"/resourceclaims/{name}/status"))


def claim_devices(api: ApiServerStandIn, name: str) -> list[dict[str, Any]]:
    stored = api.get("resourceclaims", name, "default")
    assert stored is not None
    return list(stored["status"].get("devices") or [])


def claim_reads(api: ApiServerStandIn, name: str) -> int:
    return sum(1 for r in api.requests if r.method == "GET" and r.path.endswith(f"/resourceclaims/{name}"))


async def test_a_prepares_status_write_starts_from_the_claim_as_the_prepare_read_it(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("once", ["gpu-1"])
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await until(lambda: claim_devices(api, "once") != [], timeout=3)
    assert claim_reads(api, "once") == 1 and status_patches(api, "once") == 1  # the prepare's read, then the write
    await kubelet.close()


async def test_a_claim_changed_between_the_prepares_read_and_its_status_write_is_read_again(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("moved", ["gpu-1"])
    api.slow_down("PATCH", "/resourceclaims/moved/status", 0.5)
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await until(lambda: status_patches(api, "moved") == 1, timeout=2)  # received, not yet applied
    changed = api.get("resourceclaims", "moved", "default")
    assert changed is not None
    changed["metadata"].setdefault("annotations", {})["example.com/note"] = "changed"
    api.put("resourceclaims", changed)  # a new resourceVersion: the write in flight is refused
    await until(lambda: claim_devices(api, "moved") != [], timeout=3)
    stored = api.get("resourceclaims", "moved", "default")
    assert stored is not None and stored["metadata"]["annotations"] == {"example.com/note": "changed"}
    assert claim_reads(api, "moved") == 2 and status_patches(api, "moved") == 2
    await kubelet.close()


async def test_the_unprepare_has_the_last_word_on_the_claim_status_after_a_slow_prepare_write(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("slow", ["gpu-1"])
    api.slow_down("PATCH", "/resourceclaims/slow/status", 0.6)  # the prepare's write lands late
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await until(lambda: status_patches(api, "slow") == 1, timeout=2)  # sent, held up in the server
    assert driver.api_side is not None and driver.api_side.claim_status.under_way == 1
    assert answer(await kubelet.unprepare([claim]), claim[2]).error == ""
    # the unprepare's write, after the prepare's late one, leaves the claim with no devices
    await until(
        lambda: status_patches(api, "slow") == 2 and driver.api_side.claim_status.under_way == 0,
        timeout=5,
        message="the unprepare's status write after the prepare's",
    )
    assert claim_devices(api, "slow") == []
    assert driver.api_side.claim_status.under_way == 0
    await kubelet.close()


async def test_a_claim_status_write_overtaken_before_it_is_sent_is_dropped(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claim = node.claim("again", ["gpu-2"])
    api.slow_down("PATCH", "/resourceclaims/again/status", 0.6)
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    await until(lambda: status_patches(api, "again") == 1, timeout=2)
    assert answer(await kubelet.prepare([claim]), claim[2]).error == ""  # the kubelet asks again: a second wish
    assert answer(await kubelet.unprepare([claim]), claim[2]).error == ""  # ... overtaken before it is sent
    await until(lambda: status_patches(api, "again") == 2, timeout=3)
    await stays(
        lambda: status_patches(api, "again") == 2 and claim_devices(api, "again") == [],
        for_=0.5,
        message='status_patches(api, "again") == 2 and claim_devices(api, "again") == []',
    )
    await kubelet.close()


async def test_a_claim_status_write_held_up_in_the_server_does_not_hold_up_the_stop(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    claims = [node.claim(f"held-{index}", [f"gpu-{index}"]) for index in range(4)]
    for claim in claims:
        api.slow_down("PATCH", f"/resourceclaims/{claim[1]}/status", 30.0)
    for claim in claims:
        assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
        assert answer(await kubelet.unprepare([claim]), claim[2]).error == ""  # waits behind the prepare's
    await until(lambda: sum(1 for r in api.requests if r.method == "PATCH") == 4, timeout=2)
    await kubelet.close()
    loop = asyncio.get_running_loop()
    began = loop.time()
    await node.stop(driver)
    assert loop.time() - began < 2.0
