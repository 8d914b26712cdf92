"""The GPU reset against hostile peers: documents, deletions, stops, and ixsmi misbehaving."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from reset_support import CHIP_A, CONFIG_MAP, EXPORTER, NAMESPACE, NODE, devices_file, start_with_api, write_document

from ix_device_plugin.deviceplugin.features.gpureset import OUR_NAME, ResetInfo
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

from support import RESOURCE, DaemonFactory

WHERE = f"ConfigMap {NAMESPACE}/{CONFIG_MAP} key gpuReset"


@pytest.fixture
async def apiserver():  # type: ignore[no-untyped-def]
    async with ApiServerStandIn() as server:
        server.add_node(NODE)
        yield server


async def refused(kubelet: KubeletStandIn, devices: list[str]) -> str:
    """Allocate devices, expecting a refusal; its message."""
    with pytest.raises(grpc.aio.AioRpcError) as refusal:
        await kubelet.allocate(RESOURCE, [devices])
    assert refusal.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return refusal.value.details() or ""


# ---- the document -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("occupy: " + "[" * 3000 + "]" * 3000, "nested more than 32 levels deep"),
        ("a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nnodename: *b\n", "anchors and aliases"),
    ],
    ids=["deeply-nested", "aliases"],
)
async def test_a_hostile_document_refuses_the_reset_naming_it_and_the_plugin_serves_on(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    short_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    text: str,
    problem: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="ix_device_plugin")
    write_document(apiserver, text)
    backend = SimulatedBackend(str(devices_file(tmp_path / "d.yaml")))
    await start_with_api(start_daemon, apiserver, short_dir, backend)
    await kubelet.wait_registered(RESOURCE, capacity=2)
    message = await refused(kubelet, [CHIP_A])
    assert WHERE in message and problem in message, message
    assert "cannot reach" not in message and "not reset" in message
    assert backend.resets == []
    logged = [r.getMessage() for r in caplog.records if WHERE in r.getMessage()]
    assert logged and all("cannot reach" not in line for line in logged), logged
    write_document(apiserver, ResetInfo(NODE, False, {EXPORTER: False}))  # fixed: the next Allocate resets
    await kubelet.allocate(RESOURCE, [[CHIP_A]])
    assert backend.resets == [(CHIP_A,)]
    stored = apiserver.get("configmaps", CONFIG_MAP, NAMESPACE)
    assert stored is not None and ResetInfo.parse(stored["data"]["gpuReset"], NODE).occupy[OUR_NAME] is True
