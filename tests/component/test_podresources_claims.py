"""The pod-resources stand-in answers dynamic_resources as the kubelet does, and the client reads them."""

from __future__ import annotations

import logging

import grpc

from ix_device_plugin.api.podresources import api_pb2, api_pb2_grpc
from ix_device_plugin.core.telemetry import ClaimDevice, PodRef
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.kubelet.sockets import unix_target
from ix_device_plugin.runtime.logs import OncePerError
from ix_device_plugin.standins.podresources import ClaimResource, PodClaim, PodResourcesStandIn

DRIVER = "gpu.iluvatar.com"


async def test_a_claims_devices_reach_the_client_by_driver_pool_and_name(pod_resources: PodResourcesStandIn) -> None:
    share = "6a3b1a4e-0000-4000-8000-000000000001"
    pod_resources.pods = {("ml", "job"): {"main": {"iluvatar.com/gpu": ["GPU-x"]}}}
    pod_resources.claims = {
        ("ml", "job"): {
            "main": [
                PodClaim(
                    "train",
                    (
                        ClaimResource(DRIVER, "node-a", "gpu-0", (f"{DRIVER}/claim=u-gpu-0",)),
                        ClaimResource("nic.example.com", "node-a", "nic-0", ("nic.example.com/nic=0",)),
                        ClaimResource(DRIVER, "node-a", "gpu-1", (f"{DRIVER}/claim=u-gpu-1-{share}",), share),
                    ),
                )
            ],
            "sidecar": [],
        }
    }
    reader = PodResources(pod_resources.socket_path)
    try:
        holdings = await reader.holdings(OncePerError(logging.getLogger(__name__)))
    finally:
        await reader.close()
    main = PodRef("ml", "job", "main")
    assert holdings.devices == (("iluvatar.com/gpu", "GPU-x", main),)
    assert set(holdings.claims) == {
        ClaimDevice(main, "ml", "train", DRIVER, "node-a", "gpu-0"),
        ClaimDevice(main, "ml", "train", "nic.example.com", "node-a", "nic-0"),
        ClaimDevice(main, "ml", "train", DRIVER, "node-a", "gpu-1", share),
    }


async def test_the_stand_in_reports_cdi_devices_as_the_kubelet_does(pod_resources: PodResourcesStandIn) -> None:
    """Within a driver, each device's cdi_devices also holds those of the devices before it (kubelet 1.37's
    GetDynamicResources); a share ID is set only for a share."""
    pod_resources.claims = {
        ("ml", "job"): {
            "main": [
                PodClaim(
                    "pair",
                    (ClaimResource(DRIVER, "n", "gpu-0", ("cdi-0",)), ClaimResource(DRIVER, "n", "gpu-1", ("cdi-1",))),
                )
            ]
        }
    }
    async with grpc.aio.insecure_channel(unix_target(pod_resources.socket_path)) as channel:
        answer = await api_pb2_grpc.PodResourcesListerStub(channel).List(api_pb2.ListPodResourcesRequest())
    (pod,) = answer.pod_resources
    (container,) = pod.containers
    (dynamic,) = container.dynamic_resources
    assert (dynamic.claim_namespace, dynamic.claim_name) == ("ml", "pair")
    first, second = dynamic.claim_resources
    assert [d.name for d in first.cdi_devices] == ["cdi-0"]
    assert [d.name for d in second.cdi_devices] == ["cdi-0", "cdi-1"]
    assert not first.HasField("share_id")
