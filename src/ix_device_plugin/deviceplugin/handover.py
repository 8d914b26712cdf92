"""The device plugin's side of two pods of the agent on one node, in an update or a switch between modes.

Whether a new pod registers beside an old one (kubelet/endpoints.py has the rule), and what every Allocate checks
whichever pod answers it.

The kubelet's version comes from the Node, read once and only when another pod already serves the node: a pod
alone on its node registers at once whatever the kubelet.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ix_device_plugin.api import api_pb2
from ix_device_plugin.core.allocation import AllocationError
from ix_device_plugin.core.plan import Plan
from ix_device_plugin.deviceplugin.endpoint import ENDPOINT
from ix_device_plugin.deviceplugin.features.hook import chips_of
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.kubelet.endpoints import register_beside
from ix_device_plugin.kubelet.sockets import socket_answers

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection

log = logging.getLogger(__name__)

HANDOVER_SETTLE = 1.0  # seconds a pod that waited for the old one to stop waits more before registering: an older
# kubelet disconnects "the" endpoint of a resource when the old one's stream ends, and must have done so first
KUBELET_VERSION_WAIT = 5.0  # seconds the Node's read may take
FIXED_NAME_POLL = 0.2  # seconds between looks at a plugin without the node's role that serves the fixed socket name


def fixed_name_served(own: Path) -> Path | None:
    """The fixed socket name beside own (`iluvatar-gpu.sock`) when another plugin serves it: a pod of an earlier
    release (it holds no role) or Iluvatar's own plugin. None when nothing else answers there."""
    fixed = own.with_name(ENDPOINT)
    return fixed if fixed != own and fixed.is_socket() and socket_answers(fixed) else None


async def until_fixed_name_free(own: Path) -> None:
    """Once no other plugin serves the fixed socket name (cancel to stop waiting)."""
    while fixed_name_served(own) is not None:
        await asyncio.sleep(FIXED_NAME_POLL)


async def registration_beside(setting: str, api: ApiConnection | None) -> tuple[bool, str]:
    """Another pod of the plugin serves the node: whether this one registers beside it now, and why.

    setting: --zero-downtime-upgrade; under auto the kubelet's version is read from the Node."""
    version = await kubelet_version(api) if setting == "auto" else None
    return register_beside(setting, version)


async def kubelet_version(api: ApiConnection | None) -> str | None:
    """The node's kubelet version (status.nodeInfo.kubeletVersion); None without API access, or when the Node cannot
    be read within KUBELET_VERSION_WAIT (said in the log)."""
    if api is None:
        return None
    from ix_device_plugin.apiserver.errors import KubeError
    from ix_device_plugin.apiserver.objects import NODE
    from ix_device_plugin.apiserver.settings import KubeConfigError

    try:
        async with asyncio.timeout(KUBELET_VERSION_WAIT):
            node = await (await api.kube()).get_object(NODE, api.node_name)
    except (KubeError, KubeConfigError, TimeoutError) as error:
        log.warning("cannot read the kubelet's version from the Node %s: %s", api.node_name, error or "no answer")
        return None
    return node_kubelet_version(node)


def node_kubelet_version(node: object) -> str | None:
    """The kubelet version a Node object says (status.nodeInfo.kubeletVersion); None where it says none."""
    status = node.get("status") if isinstance(node, dict) else None
    info = status.get("nodeInfo") if isinstance(status, dict) else None
    version = info.get("kubeletVersion") if isinstance(info, dict) else None
    return version if isinstance(version, str) else None


def refuse_reserved(record: RecordFile, plan: Plan, request: api_pb2.AllocateRequest) -> None:
    """AllocationError when the request names a chip the node-health record says is reserved for a reset: the pod
    acting for the node writes that before any pod's ListAndWatch says it, and either pod may answer Allocate. A
    record gone or spoiled counts as the last good one this pod read until the acting pod writes it again."""
    found = record.known()
    reserved = {} if found is None else found.reserved()
    if not reserved:
        return
    for container in request.container_requests:
        for chip in chips_of(plan, container.devices_ids):
            if chip.uuid in reserved:
                raise AllocationError(
                    f"GPU {chip.uuid} is held out of service for a reset ({reserved[chip.uuid]}); the kubelet tries "
                    "again",
                    unavailable=True,
                )
