"""flags.usevolcano: ix-device-info-cm-<node> kept current, Allocate answering with Volcano's choice.

The tests play Volcano's scheduler by annotating pods in the stand-in API server, and the kubelet with the
device-plugin and pod-resources stand-ins.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from helpers.support import RESOURCE, DaemonFactory, config_flags
from helpers.volcano_support import CHIP_A, CHIP_B, CHIP_C, NODE, SCHEDULER, Volcano, devices, placed, published
from helpers.waits import until

from ix_device_plugin.apiserver.objects import ContainerLimits, PodDoc
from ix_device_plugin.core.plan import plan
from ix_device_plugin.deviceplugin.features.volcano import (
    DEV_KUBELET,
    DEV_REAL_ALLOC,
    DEV_VOLCANO,
    DEVICE_INFO_KEY,
    DEVICE_LIST_KEY,
    PREDICATE_TIME,
    TAKEN,
    allocation_annotations,
    device_info,
    free_devices,
    held_devices,
    oldest_waiting,
    predicate_time,
)
from ix_device_plugin.deviceplugin.features.volcanotrust import Trust
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn

TRUST = Trust(NODE, RESOURCE, SCHEDULER)
ASKS = (ContainerLimits("main", {RESOURCE: "1"}),)


def pod(name: str, annotations: dict[str, str], **fields: object) -> PodDoc:
    """A pod asking for a GPU on NODE whose annotations Volcano's scheduler wrote."""
    managers = {key: frozenset({SCHEDULER}) for key in annotations}
    base = PodDoc("ml", name, f"uid-{name}", annotations, "Pending", NODE, None, ASKS, annotation_managers=managers)
    return replace(base, **fields)  # type: ignore[arg-type]


# ---- pure --------------------------------------------------------------------------------------


def test_device_info_names_each_gpu_and_its_links_as_upstream() -> None:
    inventory = SimulatedBackend("BI-V100:3").discover()
    a, b, c = (chip.uuid for chip in inventory.chips())
    inventory = replace(inventory, links={tuple(sorted((a, b))): 10, tuple(sorted((a, c))): 50})
    info = device_info(plan(inventory, Config()))
    assert set(info) == {a, b, c}
    assert info[a]["Name"] == "Iluvatar BI-V100" and info[a]["UUID"] == a
    assert info[a]["Links"] == {
        b: [{"TypeName": "P2PLinkSingleSwitch", "TypeIndex": 5}],
        c: [{"TypeName": "P2PLinkCrossCPU", "TypeIndex": 1}],
    }
    assert info[b]["Links"] == {a: [{"TypeName": "P2PLinkSingleSwitch", "TypeIndex": 5}]}, "unknown links left out"


def test_device_info_names_a_chip_as_ixml_gives_it_with_the_vendor_once() -> None:
    inventory = SimulatedBackend("BI-V100:1").discover()
    (board,) = inventory.boards
    as_ixml = replace(board, chips=tuple(replace(chip, product="Iluvatar BI-V100") for chip in board.chips))
    (info,) = device_info(plan(replace(inventory, boards=(as_ixml,)), Config())).values()
    assert info["Name"] == "Iluvatar BI-V100"


def test_replicas_are_listed_free_and_grouped_under_their_gpu() -> None:
    inventory = SimulatedBackend("BI-V100:1").discover()
    (chip,) = inventory.chips()
    shared = plan(inventory, Config(replicas=2))
    assert list(device_info(shared)) == [chip.uuid]
    assert free_devices(shared, {f"{chip.uuid}::0"}) == [f"{chip.uuid}::1"]


def test_the_oldest_pod_waiting_for_that_many_devices_is_chosen() -> None:
    pods = [
        pod("two", {DEV_VOLCANO: f"{CHIP_A},{CHIP_B}", PREDICATE_TIME: "50"}),
        pod("newer", {DEV_VOLCANO: CHIP_A, PREDICATE_TIME: "200"}),
        pod("older", {DEV_VOLCANO: CHIP_B, PREDICATE_TIME: "100"}),
        pod("taken", {DEV_VOLCANO: CHIP_C, PREDICATE_TIME: TAKEN}),
        pod("oldest-but-deleting", {DEV_VOLCANO: CHIP_C, PREDICATE_TIME: "1"}, deleting=True),
        pod("oldest-but-refused", {DEV_VOLCANO: CHIP_C, PREDICATE_TIME: "2"}, status_reason="UnexpectedAdmissionError"),
        pod("finished", {DEV_VOLCANO: CHIP_C, PREDICATE_TIME: "3"}, phase="Succeeded"),
        pod("no-time", {DEV_VOLCANO: CHIP_C}),
        pod("not-volcano", {PREDICATE_TIME: "0"}),
    ]
    assert oldest_waiting(pods, 1, TRUST).name == "older"  # type: ignore[union-attr]
    assert oldest_waiting(pods, 2, TRUST).name == "two"  # type: ignore[union-attr]
    assert oldest_waiting(pods, 3, TRUST) is None
    assert oldest_waiting([pod("no-time", {DEV_VOLCANO: CHIP_C})], 1, TRUST) is not None, "no time: last, not never"


@pytest.mark.parametrize(
    "stamp", ["-5", "-99999999999", "abc", "1_0", "+3", " 7", "1e3", "٣", "18446744073709551616", "9" * 400]
)
def test_a_predicate_time_that_is_not_an_unsigned_decimal_never_wins(stamp: str) -> None:
    pods = [
        pod("stamped", {DEV_VOLCANO: CHIP_A, PREDICATE_TIME: "100"}),
        pod("odd", {DEV_VOLCANO: CHIP_B, PREDICATE_TIME: stamp}),
    ]
    assert predicate_time(pods[1]) == int(TAKEN), "read as upstream reads it: the largest uint64"
    assert oldest_waiting(pods, 1, TRUST).name == "stamped"  # type: ignore[union-attr]
    assert oldest_waiting(pods[1:], 1, TRUST).name == "odd", "last, not never"  # type: ignore[union-attr]


def test_a_pod_placed_on_a_device_another_pod_holds_is_passed_over() -> None:
    pods = [
        pod("holder", {DEV_VOLCANO: CHIP_A, PREDICATE_TIME: TAKEN, DEV_REAL_ALLOC: CHIP_A}, phase="Running"),
        pod("handed", {DEV_VOLCANO: CHIP_C, PREDICATE_TIME: TAKEN}),  # handed out, not annotated yet
        pod("clashing", {DEV_VOLCANO: CHIP_A, PREDICATE_TIME: "1"}),
        pod("clashing-too", {DEV_VOLCANO: CHIP_C, PREDICATE_TIME: "2"}),
        pod("fine", {DEV_VOLCANO: CHIP_B, PREDICATE_TIME: "5"}),
    ]
    held = held_devices(pods, TRUST)
    assert {device: holder.name for device, holder in held.items()} == {CHIP_A: "holder", CHIP_C: "handed"}
    assert oldest_waiting(pods, 1, TRUST, held).name == "fine"  # type: ignore[union-attr]
    assert oldest_waiting(pods[:4], 1, TRUST, held) is None


def test_allocated_pods_get_upstreams_two_annotations_once() -> None:
    chosen = pod("p", {DEV_VOLCANO: CHIP_B})
    assert allocation_annotations(chosen, [CHIP_A], TRUST) == {DEV_KUBELET: CHIP_A, DEV_REAL_ALLOC: CHIP_B}
    assert allocation_annotations(pod("plain", {}), [CHIP_A], TRUST) == {DEV_KUBELET: CHIP_A, DEV_REAL_ALLOC: CHIP_A}
    assert allocation_annotations(pod("done", {DEV_REAL_ALLOC: CHIP_B}), [CHIP_A], TRUST) is None
    assert allocation_annotations(chosen, [], TRUST) is None
    forged = replace(chosen, annotation_managers={DEV_VOLCANO: frozenset({"kubectl-annotate"})})
    assert allocation_annotations(forged, [CHIP_A], TRUST) == {DEV_KUBELET: CHIP_A, DEV_REAL_ALLOC: CHIP_A}, "not it"


# ---- end to end ------------------------------------------------------------------------------------


async def test_the_device_info_config_map_is_published_in_upstreams_format(
    volcano: Volcano, apiserver: ApiServerStandIn
) -> None:
    await volcano.start()
    await until(lambda: DEVICE_INFO_KEY in published(apiserver), timeout=10)
    data = published(apiserver)
    assert set(data[DEVICE_INFO_KEY]) == {"DeviceInfo", "UpdateTime"}
    assert set(data[DEVICE_INFO_KEY]["DeviceInfo"]) == {CHIP_A, CHIP_B}  # type: ignore[arg-type]
    assert data[DEVICE_LIST_KEY]["DeviceList"] == [CHIP_A, CHIP_B]
    assert isinstance(data[DEVICE_LIST_KEY]["UpdateTime"], int)


async def test_allocate_gives_the_oldest_waiting_pod_what_volcano_chose_and_annotates_it(
    volcano: Volcano, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, pod_resources: PodResourcesStandIn
) -> None:
    # The ConfigMap is read late and written late, as under load: the pass that annotates the pods writes it.
    apiserver.slow_down("GET", "/configmaps", 1.0)
    apiserver.slow_down("POST", "/configmaps", 0.5)
    await volcano.start()
    placed(apiserver, "newer", CHIP_A, "200")
    placed(apiserver, "older", CHIP_B, "100")
    placed(apiserver, "elsewhere", CHIP_A, "1", node="other-node")

    first = await kubelet.allocate(RESOURCE, [[CHIP_A]])  # the kubelet's own choice is replaced
    assert first.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_B
    older = apiserver.get("pods", "older", "ml")
    assert older is not None and older["metadata"]["annotations"][PREDICATE_TIME] == TAKEN
    second = await kubelet.allocate(RESOURCE, [[CHIP_B]])
    assert second.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_A

    # The kubelet reports what it allocated: the pods get DevKubelet and DevRealAlloc; nothing is free.
    pod_resources.pods = {
        ("ml", "older"): {"main": {RESOURCE: [CHIP_A]}},
        ("ml", "newer"): {"main": {RESOURCE: [CHIP_B]}},
    }

    def annotated() -> bool:
        found = apiserver.get("pods", "older", "ml")
        return found is not None and DEV_REAL_ALLOC in found["metadata"]["annotations"]

    await until(annotated, timeout=10)
    annotations = apiserver.get("pods", "older", "ml")["metadata"]["annotations"]  # type: ignore[index]
    assert (annotations[DEV_KUBELET], annotations[DEV_REAL_ALLOC]) == (CHIP_A, CHIP_B)
    await until(lambda: published(apiserver).get(DEVICE_LIST_KEY, {}).get("DeviceList") == [], timeout=10)


async def test_a_device_volcano_gave_twice_is_handed_out_once(
    volcano: Volcano, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    await volcano.start()
    placed(apiserver, "first", CHIP_A, "100")
    first = await kubelet.allocate(RESOURCE, [[CHIP_B]])
    assert first.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_A
    placed(apiserver, "again", CHIP_A, "50")  # placed on the device just handed out, and older
    placed(apiserver, "other", CHIP_B, "300")
    second = await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert second.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_B
    assert any(
        "pod ml/again was placed on" in r.getMessage() and "which pod ml/first holds" in r.getMessage()
        for r in caplog.records
    )


async def test_no_waiting_pod_is_an_allocate_error_that_says_so(
    volcano: Volcano, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    await volcano.start()
    placed(apiserver, "wants-two", f"{CHIP_A},{CHIP_B}", "5")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"no pod on node {NODE} waits for 1 device(s)" in (refused.value.details() or "")


async def test_without_api_access_volcano_mode_refuses_allocate_saying_what_it_needs(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, tmp_path: Path
) -> None:
    backend = SimulatedBackend(devices(tmp_path / "devices.yaml"))
    await start_daemon(backend_factory=lambda: backend, given=config_flags(use_volcano=True))
    await kubelet.wait_registered(RESOURCE, capacity=2)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert "flags.usevolcano needs API access" in (refused.value.details() or "")
