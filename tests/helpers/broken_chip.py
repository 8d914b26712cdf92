"""The `broken_chip` fixture's node: two chips an XID breaks, the agent that heals them, and what it speaks to.

The chips are the C double's (its device file `conf`, an XID injected into it breaks a chip; their /dev nodes under
short_dir); `ixsmi -r` is a fake ixsmi that records its runs; the agent has API access (the reset handshake, Node
Events, the operator's return), the kubelet's pod-resources API, fast health looks and fast healing. A test hands
`start` another backend factory for simulated chips instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from helpers.reset_support import FAST_HEALING, NAMESPACE, NODE, Ixsmi
from helpers.support import RESOURCE, DaemonFactory, inject_xid, make_dev_root
from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.hardware.ixml import IxmlBackend
from ix_device_plugin.healing.operatorreturn import RETURN_ANNOTATION
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn, ResourceView
from ix_device_plugin.standins.podresources import PodResourcesStandIn


@dataclass
class BrokenChip:
    """A node whose chips break (see the module): start the agent, break a chip, return it as an operator does."""

    kubelet: KubeletStandIn
    start_daemon: DaemonFactory
    apiserver: ApiServerStandIn
    pod_resources: PodResourcesStandIn
    conf: Path
    short_dir: Path
    ixsmi: Ixsmi
    libs: Callable[[], dict[str, Path]]  # the C double's builds, compiled when first asked for

    def over_double(self) -> dict[str, object]:
        """Daemon settings for the C double's two chips (their /dev nodes made when missing), the fake ixsmi, fast
        health looks and fast healing."""
        self.dev_nodes()
        library, ixsmi = str(self.libs()["full"]), self.ixsmi
        return {
            "backend_factory": lambda: IxmlBackend(
                library, dev_root=self.short_dir, ixsmi_path=ixsmi.path, sysfs_root=ixsmi.sysfs
            ),
            "health_interval": 0.1,
            "healing_rules": FAST_HEALING,
        }

    async def start(self, **overrides: object) -> Daemon:
        """The agent with API access and pod-resources over the C double's chips; overrides: Options fields, or the
        Daemon's backend_factory (simulated chips instead), kube (None: no API access) and healing_rules."""
        kubeconfig = self.apiserver.write_kubeconfig(self.short_dir / "kubeconfig", namespace=NAMESPACE)
        self.dev_nodes()
        double = {} if "backend_factory" in overrides else self.over_double()
        settings: dict[str, object] = {
            "health_interval": 0.1,
            "healing_rules": FAST_HEALING,
            **double,
            "kube": settings_from({"NODE_NAME": NODE, "POD_NAMESPACE": NAMESPACE}, str(kubeconfig), "test"),
            "pod_resources_socket": self.pod_resources.socket_path,
            "reset_wait_timeout": 2.0,
            "reset_timeout": 5.0,
            **overrides,
        }
        return await self.start_daemon(**settings)

    async def started(self, **overrides: object) -> tuple[Daemon, ResourceView]:
        """start(), and the kubelet's view of the two GPUs once registered."""
        daemon = await self.start(**overrides)
        return daemon, await self.kubelet.wait_registered(RESOURCE, capacity=2)

    def dev_nodes(self) -> None:
        """The chips' /dev nodes under short_dir, made again when a test removed them."""
        if not (self.short_dir / "dev").exists():
            make_dev_root(self.short_dir, [0, 1], itrctl=False)

    def breaks(self, chip: int, xid: int, times: int = 1) -> None:
        """The C double reports XID xid on chip (its index), times times."""
        inject_xid(self.conf, chip, xid, times)

    def held(self, uuid: str) -> None:
        """A pod's container holds the chip, as the kubelet's pod-resources API says."""
        self.pod_resources.pods = {("ml", "trainer-0"): {"main": {RESOURCE: [uuid]}}}

    def released(self) -> None:
        """No container holds a chip any more."""
        self.pod_resources.pods = {}

    def returned_by_an_operator(self, uuid: str) -> None:
        """The operator's return of the chip: the Node annotated as the README says."""
        node = self.apiserver.get("nodes", NODE)
        assert node is not None
        node["metadata"].setdefault("annotations", {})[RETURN_ANNOTATION] = uuid
        self.apiserver.put("nodes", node)
