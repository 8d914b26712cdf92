"""Fixtures of the component tests: the API-server and pod-resources stand-ins, the C double's device file, and the
node set-ups several files share (Volcano mode, a chip that breaks)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers.broken_chip import BrokenChip
from helpers.reset_support import Ixsmi
from helpers.support import IXML_DOUBLE_CONFIG, TWO_CHIPS, DaemonFactory
from helpers.volcano_support import Volcano

from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn

NODE = "gpu-node-1"


@pytest.fixture
async def apiserver() -> AsyncIterator[ApiServerStandIn]:
    """An API-server stand-in that knows the node gpu-node-1, labelled with its hostname as a kubelet does."""
    async with ApiServerStandIn() as server:
        server.add_node(NODE, {"kubernetes.io/hostname": NODE})
        yield server


@pytest.fixture
async def pod_resources(short_dir: Path) -> AsyncIterator[PodResourcesStandIn]:
    """A kubelet pod-resources stand-in at <short_dir>/pod-resources/kubelet.sock."""
    standin = PodResourcesStandIn(short_dir / "pod-resources" / "kubelet.sock")
    await standin.start()
    yield standin
    await standin.stop()


@pytest.fixture
def conf(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The C double's device file, <short_dir>/double.conf with TWO_CHIPS, named by IXML_DOUBLE_CONFIG."""
    path = short_dir / "double.conf"
    path.write_text(TWO_CHIPS)
    monkeypatch.setenv(IXML_DOUBLE_CONFIG, str(path))
    return path


@pytest.fixture
def ixsmi(short_dir: Path) -> Ixsmi:
    """A fake ixsmi in short_dir that records its runs (and the node's sysfs it writes)."""
    return Ixsmi(short_dir)


@pytest.fixture
def volcano(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    pod_resources: PodResourcesStandIn,
    short_dir: Path,
    tmp_path: Path,
) -> Volcano:
    """A node in Volcano mode, not started yet: `await volcano.start()`."""
    return Volcano(kubelet, apiserver, pod_resources, start_daemon, short_dir, tmp_path)


@pytest.fixture
def broken_chip(
    request: pytest.FixtureRequest,
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    pod_resources: PodResourcesStandIn,
    conf: Path,
    short_dir: Path,
    ixsmi: Ixsmi,
) -> BrokenChip:
    """A node whose chips an XID breaks, not started yet: `daemon, view = await broken_chip.started()`."""
    libs = lambda: request.getfixturevalue("libs")  # noqa: E731 (compiled only for a test on the C double)
    return BrokenChip(kubelet, start_daemon, apiserver, pod_resources, conf, short_dir, ixsmi, libs)
