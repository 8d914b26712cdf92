"""Whether the node's kubelet takes a second device-plugin endpoint for a resource beside the first.

From Kubernetes 1.37 the kubelet's device manager keeps one endpoint per socket path for each resource name: the
newest registration answers Allocate, and the resource is marked unhealthy only when the last endpoint disconnects.
Before, a second registration replaced the first, and the first one's disconnect then cut off the second: there, a
new pod of the plugin must wait until the old one has stopped (the gap of a classic rolling update).
"""

from __future__ import annotations

import re

SEVERAL_ENDPOINTS_SINCE = (1, 37)
_VERSION = re.compile(r"^v?(\d{1,9})\.(\d{1,9})(?:\.\d{1,9})?(?:[-+].*)?$", re.ASCII | re.DOTALL)


def keeps_several_endpoints(kubelet_version: str) -> bool | None:
    """True for a kubelet (its Node's status.nodeInfo.kubeletVersion, e.g. v1.37.2) that keeps several endpoints
    per resource; None when the version cannot be read."""
    match = _VERSION.match(kubelet_version.strip())
    if match is None:
        return None
    return (int(match[1]), int(match[2])) >= SEVERAL_ENDPOINTS_SINCE


def register_beside(setting: str, kubelet_version: str | None) -> tuple[bool, str]:
    """Whether a pod starting while another pod of the plugin serves the node registers beside it now, and why.

    setting: --zero-downtime-upgrade (auto, true, false); kubelet_version: as the Node says it (None: unknown)."""
    if setting == "true":
        return True, "--zero-downtime-upgrade is true"
    if setting == "false":
        return False, "--zero-downtime-upgrade is false"
    if kubelet_version is None:
        return False, "the kubelet's version is not known (no API access to read the Node)"
    several = keeps_several_endpoints(kubelet_version)
    if several is None:
        return False, f"the kubelet's version {kubelet_version!r} cannot be read"
    if several:
        return True, f"kubelet {kubelet_version} keeps several endpoints per resource"
    return False, f"kubelet {kubelet_version} is older than 1.37: a second endpoint would cut off the first"
