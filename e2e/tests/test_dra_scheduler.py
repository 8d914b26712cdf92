"""What the real API server stores and what the real scheduler allocates from the DRA driver's slices.

The driver runs as in test_dra.py (a host process over simulated chips, the chart's ServiceAccount token and
RBAC) and is restarted with other ix-config flags where a scenario needs them: boards split
(`--splitboard true`), shared (`--replicas 4`), or other simulated boards for the pool shapes. Claims are
allocated by the real scheduler for pods on the real node; the real kubelet has the driver prepare them
and the containers print what they got. What only the API server decides (the shapes it accepts, its limits,
its CEL compiler) is checked on what the driver stored, or with server-side dry runs.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator

import pytest
import yaml
from harness.cluster import Cluster
from harness.dra import (
    CHIPS,
    DRA_VALUES,
    DRIVER,
    Driver,
    allocation,
    boards_yaml,
    chips_seen,
    claim,
    dra_chart_objects,
    driver_slices,
    minor_is,
    prepare_error,
    results,
    slice_devices,
    unschedulable_for_devices,
)
from harness.helm import of_kind
from harness.kube import Kubectl, KubectlError, Obj
from harness.plugin import Chip
from harness.pods import SHOW_DEVICES, STAY, busybox_pod, running_and_printed, shown_devices, wait_pod
from harness.waits import stays, until

SPLIT = ("--splitboard", "true")
SHARED = ("--splitboard", "true", "--replicas", "4")
EXTENDED_VALUES = {**DRA_VALUES, "dra": {"enabled": True, "extendedResourceName": "iluvatar.com/gpu"}}
BOARD_CLASS = f"board.{DRIVER}"
NODE_DEVICES = sorted([f"gpu-{chip.minor}" for chip in CHIPS] + ["board-0", "board-2"])
BOARD_CHIPS = {"board-0": {0, 1}, "board-2": {2, 3}}


@pytest.fixture(scope="module")
def device_classes(
    cluster: Cluster, dra_objects: list[Obj], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Obj]]:
    """The chart's DeviceClasses with `dra.extendedResourceName`, applied; the extended-resource class removed
    after the module (the others belong to dra_objects).
    """
    classes = of_kind(dra_chart_objects(cluster, tmp_path_factory.mktemp("helm-ext"), EXTENDED_VALUES), "DeviceClass")
    cluster.admin.apply(classes)
    yield classes
    for device_class in classes:
        if device_class["spec"].get("extendedResourceName"):
            cluster.admin.delete("DeviceClass", device_class["metadata"]["name"], wait=False)


@pytest.fixture
def whole(driver: Driver, device_classes: list[Obj]) -> Driver:
    """The driver with the default ix-config: whole boards are what one `iluvatar.com/gpu` is, nothing shared."""
    driver.configure()
    until(lambda: sorted(slice_devices(driver_slices(driver.cluster.admin))) == NODE_DEVICES, 30, "the pool")
    return driver


@pytest.fixture
def split(driver: Driver, device_classes: list[Obj]) -> Driver:
    """The driver with `flags.splitboard: true`: one `iluvatar.com/gpu` is a chip."""
    driver.configure(flags=SPLIT)
    until(lambda: sorted(slice_devices(driver_slices(driver.cluster.admin))) == NODE_DEVICES, 30, "the pool")
    return driver


@pytest.fixture
def shared(driver: Driver, device_classes: list[Obj]) -> Driver:
    """The driver with `flags.splitboard: true` and `sharing.timeSlicing.replicas: 4`: each chip has 4 shares."""
    driver.configure(flags=SHARED)
    chips = sorted(f"gpu-{chip.minor}" for chip in CHIPS)
    until(lambda: sorted(slice_devices(driver_slices(driver.cluster.admin))) == chips, 30, "the shared pool")
    return driver


def show_pod(name: str, claim_name: str) -> Obj:
    """A pod printing its devices, holding the ResourceClaim claim_name."""
    return busybox_pod(name, SHOW_DEVICES + STAY, claims=[{"name": "gpu", "resourceClaimName": claim_name}])


def create(admin: Kubectl, namespace: str, *objects: Obj) -> None:
    admin.create(list(objects), "-n", namespace)


def wait_allocated(admin: Kubectl, namespace: str, name: str, driver: Driver) -> Obj:
    """The claim's allocation, once the scheduler made it."""
    what = f"claim {namespace}/{name} allocated"
    return until(
        lambda: allocation(admin, namespace, name), 60, what, [driver.log, *driver.cluster.control_plane_logs()]
    )


def wait_unschedulable(admin: Kubectl, namespace: str, pod: str) -> Obj:
    """The pod, once the scheduler said its claims cannot be allocated."""
    return wait_pod(admin, namespace, pod, unschedulable_for_devices, "Unschedulable: cannot allocate all claims", 60)


def wait_printed(admin: Kubectl, namespace: str, pod: str, driver: Driver) -> str:
    """The pod's output, once it runs and has printed its devices."""
    wait_pod(admin, namespace, pod, running_and_printed(admin, namespace), "printed its devices", 120, [driver.log])
    return admin("logs", pod, "-n", namespace)


def resets_done(metrics: str) -> float:
    """The driver's count of GPU resets that succeeded."""
    found = re.search(r'^ix_device_plugin_dra_gpu_resets_total\{result="ok"\} (\S+)$', metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def versions(admin: Kubectl) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in driver_slices(admin)}


def stay_unwritten(admin: Kubectl, driver: Driver, what: str) -> None:
    """The slices' versions, once two looks a second apart agree (writes in flight have landed), stay the same over
    several health polls and watch events."""
    looks = [versions(admin)]

    def settled() -> dict[str, str] | None:
        looks.append(versions(admin))
        return looks[-1] if looks[-1] == looks[-2] else None

    before = until(settled, 30, "the slices settled", [driver.log], interval=1)
    stays(lambda: versions(admin) == before, 3, what, [driver.log])


# ------------------------------------------------------------------ what the API server stores


def test_the_device_classes_cel_is_compiled_and_kept(cluster: Cluster, device_classes: list[Obj]) -> None:
    """The chart's four DeviceClasses (CEL with `.?` optional attributes) are stored as written; a class whose
    CEL does not compile is refused, so the server really compiled them.
    """
    assert len(device_classes) == 4, [c["metadata"]["name"] for c in device_classes]
    assert any(".?" in s["cel"]["expression"] for c in device_classes for s in c["spec"]["selectors"])
    for device_class in device_classes:
        stored = cluster.admin.get("deviceclass", device_class["metadata"]["name"])
        assert stored["spec"] == device_class["spec"], f"stored differently: {stored['spec']}"
    broken = copy.deepcopy(device_classes[0])
    broken["metadata"] = {"name": "e2e-broken-cel"}
    broken["spec"]["selectors"][0]["cel"]["expression"] = f'device.attributes["{DRIVER}"].?type.orValue("chip") =='
    with pytest.raises(KubectlError, match="compil"):
        cluster.admin.create(broken, "--dry-run=server")


def test_the_stored_slices_are_not_rewritten_at_rest_even_with_a_taint(cluster: Cluster, whole: Driver) -> None:
    """The stored pool compares equal to what the driver wants (quantities as the server writes them, taints with
    the server's `timeAdded`): over several health polls and watch events nothing is written again.
    """
    admin = cluster.admin
    stay_unwritten(admin, whole, "the slices not rewritten at rest")
    whole.set_chips([Chip(c.uuid, c.minor, c.board, ("ECC",)) if c.minor == 3 else c for c in CHIPS])
    try:

        def tainted() -> bool:
            devices = slice_devices(driver_slices(admin))
            return all(devices[name].get("taints") for name in ("gpu-3", "board-2"))

        until(tainted, 30, "gpu-3 and board-2 tainted", [whole.log])
        devices = slice_devices(driver_slices(admin))
        assert all(t.get("timeAdded") for t in devices["gpu-3"]["taints"]), devices["gpu-3"]["taints"]
        stay_unwritten(admin, whole, "the tainted slices not rewritten at rest (timeAdded)")
    finally:
        whole.set_chips(CHIPS)
    until(lambda: not any(d.get("taints") for d in slice_devices(driver_slices(admin)).values()), 30, "untainted")


def test_the_driver_version_is_stored_and_the_schedulers_cel_compares_it(
    cluster: Cluster, admin: Kubectl, namespace: str, whole: Driver
) -> None:
    """The simulated backend reports `4.4.0` as IXML does: the server stores it on every device as a version, and
    the scheduler's CEL compares it as one: a claim for a driver newer than 4.0.0 is allocated, newer than 4.4.0
    is not.
    """
    devices = slice_devices(driver_slices(admin))
    stored = {name: device["attributes"].get("driverVersion") for name, device in devices.items()}
    assert stored == {name: {"version": "4.4.0"} for name in NODE_DEVICES}, stored
    version = f'device.attributes["{DRIVER}"].driverVersion'
    newer_than = f'{version}.isGreaterThan(semver("4.0.0")) && {version}.compareTo(semver("4.4.0")) == 0'
    create(admin, namespace, claim("recent", selector=newer_than), show_pod("recent", "recent"))
    (allocated,) = results(wait_allocated(admin, namespace, "recent", whole))
    assert allocated["device"] in NODE_DEVICES, allocated
    too_new = f'{version}.isGreaterThan(semver("4.4.0"))'
    create(admin, namespace, claim("future", selector=too_new), show_pod("future", "future"))
    wait_unschedulable(admin, namespace, "future")
    assert allocation(admin, namespace, "future") is None


# ------------------------------------------------------------------ what the scheduler allocates


def test_a_board_then_only_the_other_boards_chips_through_the_counters(
    cluster: Cluster, admin: Kubectl, namespace: str, whole: Driver
) -> None:
    """board.gpu.iluvatar.com gives a board; gpu.iluvatar.com then gives only the other board's two chips (the
    board took its chips' counters), and a third chip claim is unschedulable. The kubelet has the driver prepare
    both, and each container sees exactly its chips.
    """
    create(admin, namespace, claim("board", BOARD_CLASS), show_pod("board", "board"))
    (board,) = [r["device"] for r in results(wait_allocated(admin, namespace, "board", whole))]
    assert board in BOARD_CHIPS, f"the board class gave {board}"
    create(admin, namespace, claim("chips", count=2), show_pod("chips", "chips"))
    chips = sorted(r["device"] for r in results(wait_allocated(admin, namespace, "chips", whole)))
    (other,) = set(BOARD_CHIPS) - {board}
    assert chips == sorted(f"gpu-{minor}" for minor in BOARD_CHIPS[other]), f"{board} allocated, chips {chips}"
    create(admin, namespace, claim("third"), show_pod("third", "third"))
    wait_unschedulable(admin, namespace, "third")
    assert allocation(admin, namespace, "third") is None
    seen_board = {chip.minor for chip in chips_seen(wait_printed(admin, namespace, "board", whole))}
    seen_chips = {chip.minor for chip in chips_seen(wait_printed(admin, namespace, "chips", whole))}
    assert (seen_board, seen_chips) == (BOARD_CHIPS[board], BOARD_CHIPS[other])


def test_an_admin_access_claim_gets_a_held_chip_but_not_a_chip_of_a_held_board(
    cluster: Cluster, admin: Kubectl, namespace: str, whole: Driver
) -> None:
    """A chip takes one of its counter's two units, a board both: a monitoring claim (adminAccess) gets a chip a
    workload holds and the driver prepares it, but a chip of a board in use is not allocated.
    """
    admin("label", "namespace", namespace, "resource.kubernetes.io/admin-access=true")
    create(admin, namespace, claim("board", BOARD_CLASS), show_pod("board", "board"))
    (board,) = [r["device"] for r in results(wait_allocated(admin, namespace, "board", whole))]
    create(admin, namespace, claim("chip"), show_pod("chip", "chip"))
    (chip,) = [r["device"] for r in results(wait_allocated(admin, namespace, "chip", whole))]
    held = int(chip.removeprefix("gpu-"))
    assert held not in BOARD_CHIPS[board], f"{board} allocated, and its chip {chip}"
    monitor = claim("monitor", selector=minor_is(held), admin_access=True)
    create(admin, namespace, monitor, show_pod("monitor", "monitor"))
    (result,) = results(wait_allocated(admin, namespace, "monitor", whole))
    assert (result["device"], result.get("adminAccess")) == (chip, True), result
    assert [c.minor for c in chips_seen(wait_printed(admin, namespace, "monitor", whole))] == [held]
    assert not prepare_error(admin, namespace, "monitor")
    of_board = min(BOARD_CHIPS[board])
    create(
        admin,
        namespace,
        claim("monitor-board", selector=minor_is(of_board), admin_access=True),
        show_pod("monitor-board", "monitor-board"),
    )
    wait_unschedulable(admin, namespace, "monitor-board")
    assert allocation(admin, namespace, "monitor-board") is None


def test_a_claims_opaque_config_reaches_the_allocation_and_the_driver(
    cluster: Cluster, admin: Kubectl, namespace: str, whole: Driver
) -> None:
    """A GpuConfig in a claim is copied into its allocation with `source: FromClaim`; the driver reads it there:
    `reset: true` resets the chip through the handshake ConfigMap before the container starts, and a misspelt
    field fails that claim's prepare naming the field.
    """
    assert whole.run is not None
    resets = resets_done(whole.run.metrics())
    config = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "reset": True}
    typo = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "resets": True}
    create(admin, namespace, claim("fresh", config=config), show_pod("fresh", "fresh"))
    create(admin, namespace, claim("typo", config=typo), show_pod("typo", "typo"))
    fresh = wait_allocated(admin, namespace, "fresh", whole)
    (copied,) = fresh["devices"].get("config") or [{}]
    assert copied.get("source") == "FromClaim", fresh["devices"]
    assert copied.get("opaque") == {"driver": DRIVER, "parameters": config}, fresh["devices"]
    (chip,) = chips_seen(wait_printed(admin, namespace, "fresh", whole))
    assert results(fresh)[0]["device"] == f"gpu-{chip.minor}"
    assert resets_done(whole.run.metrics()) == resets + 1, "the driver did not reset the chip"
    handshake = admin.get("configmap", f"ix-gpu-reset-{cluster.node_name}", "kube-system")
    document = yaml.safe_load(handshake["data"]["gpuReset"])
    assert document["reset"] is False and document["occupy"] == {"ix-device-plugin": True}, document
    error = until(lambda: prepare_error(admin, namespace, "typo"), 60, "the typo claim's prepare error")
    assert "parameters.resets: unknown field" in error, error


def test_iluvatar_gpu_2_gets_two_boards_on_a_whole_board_node(
    cluster: Cluster, admin: Kubectl, namespace: str, whole: Driver
) -> None:
    """`iluvatar.com/gpu: 2` through the extended-resource class, boards not split: two whole boards."""
    pod = busybox_pod("two", SHOW_DEVICES + STAY, gpus=2)
    admin.create(pod, "-n", namespace)
    seen = chips_seen(wait_printed(admin, namespace, "two", whole))
    (made,) = admin.items("resourceclaims", namespace)
    assert sorted(r["device"] for r in results(made["status"]["allocation"])) == sorted(BOARD_CHIPS)
    assert [chip.minor for chip in seen] == [0, 1, 2, 3]


def test_iluvatar_gpu_2_gets_two_chips_on_a_split_node(
    cluster: Cluster, admin: Kubectl, namespace: str, split: Driver
) -> None:
    """`iluvatar.com/gpu: 2` through the extended-resource class, boards split: two chips."""
    pod = busybox_pod("two", SHOW_DEVICES + STAY, gpus=2)
    admin.create(pod, "-n", namespace)
    seen = chips_seen(wait_printed(admin, namespace, "two", split))
    (made,) = admin.items("resourceclaims", namespace)
    devices = sorted(r["device"] for r in results(made["status"]["allocation"]))
    assert devices == sorted(f"gpu-{chip.minor}" for chip in seen) and len(devices) == 2, devices


# ------------------------------------------------------------------ shares


def test_four_shares_of_a_chip_then_none(cluster: Cluster, admin: Kubectl, namespace: str, shared: Driver) -> None:
    """With 4 replicas a chip is published shared: four claims, of the chip class or of share.gpu.iluvatar.com, get a
    share each (distinct shareIDs, one share and no memory consumed), a fifth is unschedulable; the driver prepares
    the four with slots 0 to 3 and writes each claim's status.devices with its shareID, which the server's
    validation accepts.
    """
    devices = slice_devices(driver_slices(admin))
    for name, device in devices.items():
        assert device.get("allowMultipleAllocations") is True, device
        assert device["capacity"]["shares"]["value"] == "4", device["capacity"]
        assert not device.get("consumesCounters"), name
    names = [f"share-{i}" for i in range(4)]
    for i, name in enumerate(names):  # half through the chip class, half through the class of shares
        device_class = "share.gpu.iluvatar.com" if i % 2 else DRIVER
        create(admin, namespace, claim(name, device_class, selector=minor_is(0)), show_pod(name, name))
    allocated = {name: results(wait_allocated(admin, namespace, name, shared)) for name in names}
    for (result,) in allocated.values():
        assert result["device"] == "gpu-0" and result.get("shareID"), result
        assert result.get("consumedCapacity") == {"shares": "1", "memory": "0"}, result
    assert len({result["shareID"] for (result,) in allocated.values()}) == 4, allocated
    create(admin, namespace, claim("share-4", selector=minor_is(0)), show_pod("share-4", "share-4"))
    wait_unschedulable(admin, namespace, "share-4")
    uuid = CHIPS[0].uuid
    slots = set()
    for name in names:
        output = wait_printed(admin, namespace, name, shared)
        assert [chip.minor for chip in chips_seen(output)] == [0]
        replica = shown_devices(output)[1]["IX_REPLICA_DEVICES"]
        match = re.fullmatch(rf"{uuid}::(\d+)", replica)
        assert match, f"{name}: IX_REPLICA_DEVICES={replica}"
        slots.add(int(match.group(1)))
    assert slots == {0, 1, 2, 3}

    def status_written() -> bool:
        for name, (result,) in allocated.items():
            status = (admin.get("resourceclaim", name, namespace).get("status") or {}).get("devices") or []
            if [(d["device"], d.get("shareID")) for d in status] != [("gpu-0", result["shareID"])]:
                return False
        return True

    until(status_written, 30, "status.devices with each claim's shareID", [shared.log])


def test_a_claim_for_all_four_shares_holds_the_chip_alone(
    cluster: Cluster, admin: Kubectl, namespace: str, shared: Driver
) -> None:
    """A claim asking for all 4 shares of a chip consumes them all: no other claim gets that chip."""
    create(admin, namespace, claim("all", selector=minor_is(1), shares=4), show_pod("all", "all"))
    (result,) = results(wait_allocated(admin, namespace, "all", shared))
    assert result["device"] == "gpu-1" and result.get("consumedCapacity") == {"shares": "4", "memory": "0"}, result
    create(admin, namespace, claim("one-more", selector=minor_is(1)), show_pod("one-more", "one-more"))
    wait_unschedulable(admin, namespace, "one-more")
    output = wait_printed(admin, namespace, "all", shared)
    assert [chip.minor for chip in chips_seen(output)] == [1]
    replicas = shown_devices(output)[1]["IX_REPLICA_DEVICES"].split(",")
    assert sorted(replicas) == [f"{CHIPS[1].uuid}::{slot}" for slot in range(4)], replicas


# ------------------------------------------------------------------ pool shapes


def bi_v150(boards: int, sick: bool = False) -> str:
    """Simulated BI-V150 boards; with sick, the first board's second chip (gpu-1) has an ECC error."""
    entries: list[Obj] = [{"product": "BI-V150"} for _ in range(boards)]
    if sick:
        entries[0] = {"product": "BI-V150", "chips": [None, {"health": ["ECC"]}]}
    return boards_yaml(entries)


def chip_names(count: int) -> list[str]:
    return [f"gpu-{minor}" for minor in range(count)]


def board_names(boards: int) -> list[str]:
    return [f"board-{2 * board}" for board in range(boards)]


# (what, simulated devices, flags, device names, slices: devices + counter sets, shares of each device)
SHAPES = [
    ("16 x BI-V150", bi_v150(16), (), chip_names(32) + board_names(16), 1 + 2, None),
    ("40 x BI-V150, boards split", bi_v150(40), SPLIT, chip_names(80) + board_names(40), 2 + 5, None),
    ("2 x BI-V150 split, 4 shares", bi_v150(2), SHARED, chip_names(4), 1, "4"),
    ("40 x BI-V150 whole, 8 shares", bi_v150(40), ("--replicas", "8"), board_names(40), 1, "8"),
    ("8 x MR-V50", boards_yaml([{"product": "MR-V50"} for _ in range(8)]), (), chip_names(8), 1 + 1, None),
    (
        "40 x BI-V150, gpu-1 with an ECC error",
        bi_v150(40, sick=True),
        ("--self-healing", "false"),  # its reset would write the slice again (the healing taint): not this scenario
        chip_names(80) + board_names(40),
        2 + 5,
        None,
    ),
]


def complete_pool(admin: Kubectl, names: list[str]) -> list[Obj] | None:
    """The driver's slices once they hold exactly these devices, all at one pool generation and slice count."""
    slices = driver_slices(admin)
    if sorted(slice_devices(slices)) != sorted(names):
        return None
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    return slices if len(generations) == 1 and counts == {len(slices)} else None


def test_the_api_server_stores_every_pool_shape(cluster: Cluster, driver: Driver) -> None:
    """Each pool shape the driver makes is written and stored whole: the devices in slices of at most 64 when
    they consume counters or are tainted (128 otherwise), the counter sets in slices of their own (at most 8),
    every slice at one generation and written once (the boards and the sick chip's taint in the first write),
    shared devices with their shares, a sick chip and its board tainted.
    """
    admin = cluster.admin
    for what, devices, flags, names, slice_count, shares in SHAPES:
        driver.configure(devices, flags)
        slices = until(lambda names=names: complete_pool(admin, names), 60, f"the pool of {what}", [driver.log])
        assert len(slices) == slice_count, f"{what}: {len(slices)} slices"
        written = {(s["spec"]["pool"]["generation"], s["metadata"]["generation"]) for s in slices}
        assert written == {(1, 1)}, f"{what}: written more than once (pool generation, generation): {written}"
        device_slices = [s for s in slices if s["spec"].get("devices")]
        counter_slices = [s for s in slices if s["spec"].get("sharedCounters")]
        assert not {s["metadata"]["name"] for s in device_slices} & {s["metadata"]["name"] for s in counter_slices}
        for s in device_slices:
            limited = any(d.get("consumesCounters") or d.get("taints") for d in s["spec"]["devices"])
            assert len(s["spec"]["devices"]) <= (64 if limited else 128), f"{what}: {len(s['spec']['devices'])}"
        assert all(len(s["spec"]["sharedCounters"]) <= 8 for s in counter_slices), what
        stored = slice_devices(slices)
        counter_sets = {c["name"] for s in counter_slices for c in s["spec"]["sharedCounters"]}
        used = {c["counterSet"] for d in stored.values() for c in d.get("consumesCounters") or []}
        assert used == counter_sets, f"{what}: counter sets {sorted(counter_sets)}, used {sorted(used)}"
        if shares is not None:
            assert not counter_sets, what
            assert all(d.get("allowMultipleAllocations") for d in stored.values()), what
            assert {d["capacity"]["shares"]["value"] for d in stored.values()} == {shares}, what
        else:  # a set per board, single-chip ones too: every device charges its chips to the common `chips`
            assert {name for name in names if name.startswith("board-")} <= counter_sets, what
            charged = {n: [c["counters"]["chips"]["value"] for c in d["consumesCounters"]] for n, d in stored.items()}
            assert all(v == (["2"] if n.startswith("board-") else ["1"]) for n, v in charged.items()), what
        tainted = sorted(name for name, d in stored.items() if d.get("taints"))
        assert tainted == (["board-0", "gpu-1"] if "ECC" in what else []), f"{what}: tainted {tainted}"


def test_the_api_server_refuses_65_devices_with_counters_in_one_slice(cluster: Cluster, driver: Driver) -> None:
    """A full slice of the 40-board pool (64 devices drawing on counters) is accepted again as it is (server-side
    dry run); with one device more the server refuses it: the driver's limit of 64 is the server's.
    """
    admin = cluster.admin
    names = chip_names(80) + board_names(40)
    driver.configure(bi_v150(40))
    slices = until(lambda: complete_pool(admin, names), 60, "the pool of 40 x BI-V150", [driver.log])
    device_slices = sorted((s for s in slices if s["spec"].get("devices")), key=lambda s: -len(s["spec"]["devices"]))
    full, other = device_slices[:2]
    assert len(full["spec"]["devices"]) == 64 and any(d.get("consumesCounters") for d in full["spec"]["devices"])
    copied = {"apiVersion": full["apiVersion"], "kind": full["kind"], "metadata": {"name": "e2e-full-slice"}}
    copied["spec"] = copy.deepcopy(full["spec"])
    admin.create(copied, "--dry-run=server")
    copied["spec"]["devices"].append(other["spec"]["devices"][0])
    with pytest.raises(KubectlError, match="Too many: 65: must have at most 64 items"):
        admin.create(copied, "--dry-run=server")
