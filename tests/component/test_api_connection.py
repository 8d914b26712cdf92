"""The one API connection of a process: made on first use, shared by every feature, closed once at shutdown."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from helpers.dra_support import NODE as DRA_NODE
from helpers.dra_support import DraNode
from helpers.support import RESOURCE, DaemonFactory, config_flags
from helpers.waits import until

from ix_device_plugin.apiserver import connection as connection_module
from ix_device_plugin.apiserver.connection import ApiConnection, ConnectionClosed
from ix_device_plugin.apiserver.errors import KubeError
from ix_device_plugin.apiserver.settings import KubeConfigError, settings_from
from ix_device_plugin.hardware.simulated import SimulatedBackend, default_uuid
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn

NODE = "gpu-node-1"
NAMESPACE = "kube-system"
LABEL = "iluvatar.com/device-plugin.config"


@pytest.fixture
async def apiserver():
    async with ApiServerStandIn() as server:
        server.add_node(NODE)
        yield server


@pytest.fixture
def kubeconfig(apiserver: ApiServerStandIn, short_dir: Path) -> Path:
    return apiserver.write_kubeconfig(short_dir / "kubeconfig", namespace=NAMESPACE)


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes each client was made for, counting every client the process makes."""
    made: list[str] = []
    real = connection_module.connect

    async def counting(settings):  # type: ignore[no-untyped-def]
        made.append(settings.node_name)
        return await real(settings)

    monkeypatch.setattr(connection_module, "connect", counting)
    return made


def test_plain_plugging_does_not_import_the_client_library():
    script = (
        "import sys\n"
        "import ix_device_plugin.deviceplugin.daemon, ix_device_plugin.cli\n"
        "import ix_device_plugin.apiserver.client, ix_device_plugin.apiserver.nodelabel\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx2', 'httpx', 'httpcore2')))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert completed.stdout.strip() == "[]"


def test_the_connection_imports_the_client_library_at_its_first_use_and_asks_nothing(kubeconfig, apiserver):
    script = (
        "import asyncio, sys\n"
        "from ix_device_plugin.apiserver.connection import ApiConnection\n"
        "from ix_device_plugin.apiserver.settings import settings_from\n"
        f"api = ApiConnection(settings_from({{'NODE_NAME': 'n'}}, {str(kubeconfig)!r}, 'test'))\n"
        "print('lightkube' in sys.modules)\n"
        "asyncio.run(api.kube())\n"
        "print('lightkube' in sys.modules)\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert completed.stdout.split() == ["False", "True"]
    assert apiserver.requests == []  # creating the client asks the API server nothing


async def test_every_caller_gets_the_same_client_and_close_is_final(kubeconfig, connects):
    api = ApiConnection(settings_from({"NODE_NAME": NODE}, str(kubeconfig), "test"))
    first, second = await asyncio.gather(api.kube(), api.kube())
    assert first is second and connects == [NODE]
    await api.close()
    await api.close()  # a second close is harmless
    with pytest.raises(ConnectionClosed, match="the API connection is closed") as caught:
        await api.kube()
    assert not caught.value.transient


async def test_retry_rides_out_an_outage_with_the_connections_policy(kubeconfig, apiserver):
    api = ApiConnection(settings_from({"NODE_NAME": NODE}, str(kubeconfig), "test"), Backoff(0.02, 0.05))
    apiserver.unavailable = True

    async def back_soon() -> None:
        await asyncio.sleep(0.3)
        apiserver.unavailable = False

    task = asyncio.create_task(back_soon())
    labels = await api.retry(lambda kube: kube.get_node(NODE))
    await task
    assert labels == {}
    assert sum(r.path == f"/api/v1/nodes/{NODE}" for r in apiserver.requests) >= 3
    with pytest.raises(KubeError, match="HTTP 404"):  # what trying again cannot fix is raised at once
        await api.retry(lambda kube: kube.get_node("absent"))
    assert sum(r.path == "/api/v1/nodes/absent" for r in apiserver.requests) == 1
    await api.close()


async def test_an_unusable_kubeconfig_is_a_config_error_not_retried(tmp_path, connects):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("- a list\n")
    api = ApiConnection(settings_from({"NODE_NAME": NODE}, str(kubeconfig), "test"))
    with pytest.raises(KubeConfigError, match=rf"^kubeconfig {kubeconfig}: "):
        await api.retry(lambda kube: kube.get_node(NODE))
    assert connects == [NODE]


async def test_the_daemon_makes_one_connection_for_every_feature_and_closes_it(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    kubeconfig: Path,
    connects: list[str],
) -> None:
    settings = settings_from({"NODE_NAME": NODE, "POD_NAMESPACE": NAMESPACE}, str(kubeconfig), "test")
    daemon = await start_daemon(
        "BI-V100:1",
        given=config_flags(use_volcano=True, reset_gpu=True),
        per_node_config=True,
        kube=settings,
        backend_factory=lambda: SimulatedBackend("BI-V100:1"),
    )
    await kubelet.wait_registered(RESOURCE, capacity=1)
    # The node label is watched, the reset handshake announced and Volcano's ConfigMap written.
    await until(lambda: apiserver.get("configmaps", f"ix-gpu-reset-{NODE}", NAMESPACE) is not None, timeout=10)
    await until(lambda: apiserver.get("configmaps", f"ix-device-info-cm-{NODE}", NAMESPACE) is not None, timeout=10)
    await until(lambda: any(r.query.get("watch") == "true" for r in apiserver.requests), timeout=10)
    assert connects == [NODE]
    assert daemon.apiserver is not None
    await daemon.shutdown()
    with pytest.raises(ConnectionClosed):
        await daemon.apiserver.kube()


async def test_an_api_server_that_answers_no_is_not_called_unreachable(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory, apiserver: ApiServerStandIn, kubeconfig: Path
) -> None:
    apiserver.token = "another token"  # every request is answered 401
    settings = settings_from({"NODE_NAME": NODE, "POD_NAMESPACE": NAMESPACE}, str(kubeconfig), "test")
    await start_daemon("BI-V100:1", given=config_flags(reset_gpu=True), kube=settings)
    await kubelet.wait_registered(RESOURCE, capacity=1)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await kubelet.allocate(RESOURCE, [[default_uuid(0, 0)]])
    details = refused.value.details() or ""
    assert details.startswith("GPU reset before Allocate: the reset handshake failed: get configmap "), details
    assert "HTTP 401 Unauthorized" in details and "cannot reach" not in details


async def test_the_dra_driver_makes_one_connection_and_closes_it(
    short_dir: Path, apiserver: ApiServerStandIn, connects: list[str]
) -> None:
    node = DraNode(short_dir, apiserver)
    driver = await node.start()
    await until(lambda: apiserver.objects("resourceslices") != [], timeout=10)
    assert connects == [DRA_NODE]
    await node.stop(driver)
    assert driver.api is not None
    with pytest.raises(ConnectionClosed):
        await driver.api.kube()
