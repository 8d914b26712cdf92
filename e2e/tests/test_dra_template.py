"""`ix-device-plugin template` on the real cluster: for each ix-config, the slices the DRA driver published on the
node, as the real API server stores them, are what the template prints for the node's shape and config, less what
the server sets and the Node's owner reference.

The driver runs as in test_dra.py (a host process over simulated boards) with its ix-config from a file (`--config`)
and a sysfs with no PCI devices (no PCIe roots, as the template has none), the same file handed to `template`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.dra import Driver, boards_yaml, driver_slices
from harness.kube import Obj
from harness.plugin import plugin_command
from harness.waits import until

BOARDS = 2
PRODUCT = "BI-V150"
SERVER_SET = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields", "ownerReferences")
CONFIGS = {
    "unsplit": "",
    "split": "flags:\n  splitboard: true\n",
    "shared-boards": "sharing:\n  timeSlicing:\n    replicas: 2\n",
    "shared-chips": "flags:\n  splitboard: true\nsharing:\n  timeSlicing:\n    replicas: 4\n",
}


def complete_pool(cluster: Cluster) -> list[Obj] | None:
    """The driver's slices once the pool is whole (one generation, every slice there), without what the server
    sets; None until then."""
    slices = driver_slices(cluster.admin)
    pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices}
    if len(pools) != 1 or next(iter(pools))[1] != len(slices):
        return None
    for obj in slices:
        for field in SERVER_SET:
            obj["metadata"].pop(field, None)
    return slices


def template(config: Path, node: str) -> list[Obj]:
    argv = [*plugin_command(), "template", "--product", PRODUCT, "--boards", str(BOARDS), "--config", str(config)]
    printed = subprocess.run([*argv, "--node", node, "--output", "json"], capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    return sorted(json.loads(printed.stdout)["items"], key=lambda obj: obj["metadata"]["name"])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_template_is_what_the_driver_published(cluster: Cluster, driver: Driver, name: str) -> None:
    config = driver.workdir / f"ix-config-{name}.yaml"
    config.write_text(CONFIGS[name])
    sysfs = driver.workdir / "sys-without-pci-devices"
    (sysfs / "bus" / "pci" / "drivers").mkdir(parents=True, exist_ok=True)
    devices = boards_yaml([{"product": PRODUCT}] * BOARDS)
    driver.configure(devices, ["--config", str(config), "--sysfs-root", str(sysfs)])
    published = until(lambda: complete_pool(cluster), 60, f"the pool with {name}", [driver.log])
    owners = {
        (ref["kind"], ref["name"]) for obj in driver_slices(cluster.admin) for ref in obj["metadata"]["ownerReferences"]
    }
    assert owners == {("Node", cluster.node_name)}, "the real node's slices are owned by it; the template's by none"
    assert published == template(config, cluster.node_name)
