"""Volcano's choice is believed only from Volcano: a pod's iluvatar.com/DevVolcano and predicate-time count only when
the pod asks for the resource on this node and the API server records Volcano's scheduler as their writer. A pod
that does not pass is refused with an Event on it, and never takes another pod's Allocate."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from helpers.support import RESOURCE
from helpers.volcano_support import CHIP_A, CHIP_B, NODE, SCHEDULER, Volcano, placed
from helpers.waits import until

from ix_device_plugin.deviceplugin.features.volcano import DEV_VOLCANO, PREDICATE_TIME, TAKEN
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.apiserver.managedfields import Writer
from ix_device_plugin.standins.kubelet import KubeletStandIn

REFUSED = "VolcanoAnnotationRefused"


def refusals(apiserver: ApiServerStandIn, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The Events saying the pod's Volcano annotations were refused."""
    return [
        event
        for event in apiserver.objects("events")
        if event["metadata"]["namespace"] == namespace
        and event["involvedObject"].get("name") == pod
        and event["reason"] == REFUSED
    ]


def annotation(apiserver: ApiServerStandIn, namespace: str, pod: str, key: str) -> str | None:
    found = apiserver.get("pods", pod, namespace)
    return None if found is None else found["metadata"]["annotations"].get(key)


async def test_a_tenants_forged_annotations_are_refused_with_an_event_and_take_no_other_pods_allocate(
    volcano: Volcano, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    await volcano.start()
    placed(apiserver, "victim", CHIP_B, "100")
    # A tenant's own pod asks for a GPU and claims to be first: `kubectl annotate` writes as kubectl-annotate.
    placed(apiserver, "thief", CHIP_A, "0", manager="kubectl-annotate", namespace="tenant")

    response = await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert response.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_B, "the victim's choice"
    assert annotation(apiserver, "ml", "victim", PREDICATE_TIME) == TAKEN
    assert annotation(apiserver, "tenant", "thief", PREDICATE_TIME) == "0"
    await until(lambda: refusals(apiserver, "tenant", "thief"), timeout=10)
    (event,) = refusals(apiserver, "tenant", "thief")
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Pod"
    assert event["involvedObject"]["namespace"] == "tenant" and event["involvedObject"]["uid"]
    assert '"kubectl-annotate"' in event["message"] and '"vc-scheduler"' in event["message"]

    with pytest.raises(grpc.aio.AioRpcError) as refused:  # the thief alone waits now: refused, naming it and why
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    details = refused.value.details() or ""
    assert f"no pod on node {NODE} waits for 1 device(s)" in details
    assert "pod tenant/thief" in details and '"kubectl-annotate"' in details
    assert annotation(apiserver, "tenant", "thief", PREDICATE_TIME) == "0"
    assert len(refusals(apiserver, "tenant", "thief")) == 1, "one Event per pod, however often it is passed over"


async def test_a_pod_that_asks_for_no_gpu_is_passed_over(
    volcano: Volcano, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    await volcano.start()
    placed(apiserver, "cpu-only", CHIP_A, "1", gpus=0)
    placed(apiserver, "asks", CHIP_B, "100")
    response = await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert response.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_B
    assert annotation(apiserver, "ml", "cpu-only", PREDICATE_TIME) == "1"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert f"pod ml/cpu-only: it asks for no {RESOURCE}" in (refused.value.details() or "")


async def test_the_scheduler_is_the_field_manager_the_setting_names(
    volcano: Volcano, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    await volcano.start(volcano_field_manager="sched-x")
    await kubelet.wait_registered(RESOURCE, capacity=2)
    placed(apiserver, "default-name", CHIP_A, "1")  # written as vc-scheduler: not the scheduler of this cluster
    placed(apiserver, "ours", CHIP_B, "100", manager="sched-x")
    response = await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert response.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_B
    await until(lambda: refusals(apiserver, "ml", "default-name"), timeout=10)


async def test_a_refused_pod_that_the_scheduler_then_writes_is_believed(
    volcano: Volcano, kubelet: KubeletStandIn, apiserver: ApiServerStandIn
) -> None:
    await volcano.start()
    placed(apiserver, "early", CHIP_A, "0", manager="kubectl-annotate")
    with pytest.raises(grpc.aio.AioRpcError):
        await kubelet.allocate(RESOURCE, [[CHIP_A]])
    notes = {"metadata": {"annotations": {DEV_VOLCANO: CHIP_B, PREDICATE_TIME: "42"}}}
    apiserver.patch("pods", "early", "ml", notes, Writer(SCHEDULER, "v1"))  # Volcano places it: its writing now
    response = await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert response.container_responses[0].envs["IX_VISIBLE_DEVICES"] == CHIP_B
