"""The v1beta1 API: the committed modules match api.proto, and the wire contract is the kubelet's."""

from __future__ import annotations

from pathlib import Path

from helpers.support import REPO_ROOT

from ix_device_plugin.api import api_pb2
from ix_device_plugin.api.generate import API_DIR, generate


def test_generated_modules_are_current(tmp_path: Path) -> None:
    pairs = generate(tmp_path)
    assert len(pairs) == 21  # device plugin, pod-resources, DRA v1, v1beta1, registration, health x2: 3 modules each
    for produced, committed in pairs:
        assert committed.read_text() == produced.read_text(), (
            f"{committed.relative_to(API_DIR)} is stale: run python -m ix_device_plugin.api.generate"
        )


def test_the_pod_resources_proto_is_the_upstream_one() -> None:
    upstream = REPO_ROOT.parent / "shared" / "kubelet-apis" / "podresources" / "v1" / "api.proto"
    if upstream.exists():  # the upstream copy sits beside the repository where it is checked out
        assert (API_DIR / "podresources" / "api.proto").read_text() == upstream.read_text()
    from ix_device_plugin.api.podresources import api_pb2 as podresources

    assert podresources.DESCRIPTOR.package == "v1"
    service = podresources.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]


def fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


def test_wire_contract() -> None:
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    services = {s.name: [m.name for m in s.methods] for s in api_pb2.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "Registration": ["Register"],
        "DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    assert fields(api_pb2.RegisterRequest) == {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}
    assert fields(api_pb2.DevicePluginOptions) == {"pre_start_required": 1, "get_preferred_allocation_available": 2}
    assert fields(api_pb2.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert fields(api_pb2.NUMANode) == {"ID": 1}
    assert fields(api_pb2.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert fields(api_pb2.ContainerPreferredAllocationResponse) == {"deviceIDs": 1}
    assert fields(api_pb2.ContainerAllocateRequest) == {"devices_ids": 1}
    assert fields(api_pb2.ContainerAllocateResponse) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert fields(api_pb2.DeviceSpec) == {"container_path": 1, "host_path": 2, "permissions": 3}
    assert fields(api_pb2.Mount) == {"container_path": 1, "host_path": 2, "read_only": 3}
    method = api_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"]
    assert method.server_streaming and not method.client_streaming


UPSTREAM = REPO_ROOT.parent / "shared" / "kubelet-apis"


def test_the_dra_and_registration_protos_are_the_upstream_ones() -> None:
    copies = {
        "dra/v1": "dra_v1",
        "dra/v1beta1": "dra_v1beta1",
        "pluginregistration/v1": "pluginregistration",
        "dra-health/v1": "dra_health_v1",
        "dra-health/v1alpha1": "dra_health_v1alpha1",
    }
    for upstream, ours in copies.items():
        if (UPSTREAM / upstream / "api.proto").exists():
            assert (API_DIR / ours / "api.proto").read_text() == (UPSTREAM / upstream / "api.proto").read_text()
    from ix_device_plugin.api.dra_v1 import api_pb2 as dra_v1
    from ix_device_plugin.api.dra_v1beta1 import api_pb2 as dra_v1beta1
    from ix_device_plugin.api.pluginregistration import api_pb2 as registration

    assert dra_v1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert dra_v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    for module in (dra_v1, dra_v1beta1):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
        assert fields(module.Claim) == {"namespace": 1, "uid": 2, "name": 3}
    assert fields(dra_v1.Device) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert registration.DESCRIPTOR.package == "pluginregistration"
    service = registration.DESCRIPTOR.services_by_name["Registration"]
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert fields(registration.PluginInfo) == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
