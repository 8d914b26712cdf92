"""`ix-device-plugin template` on the real cluster: for each ix-config, the slices the DRA driver published on the
node, as the real API server stores them, are what the template prints for the node's shape and config, less what
the server sets and the Node's owner reference (quantities compared by value: the server stores `64Gi` for the
`65536Mi` the driver and the template say).

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

from ix_device_plugin.dra.pool import quantity

BOARDS = 2
PRODUCT = "BI-V150"
SERVER_SET = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields", "ownerReferences")
CONFIGS = {
    "unsplit": "flags:\n  splitboard: false\n",
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
    devices = boards_yaml([{"product": PRODUCT} for _ in range(BOARDS)])
    driver.configure(devices, ["--config", str(config), "--sysfs-root", str(sysfs)])
    published = until(lambda: complete_pool(cluster), 60, f"the pool with {name}", [driver.log])
    owners = {
        (ref["kind"], ref["name"]) for obj in driver_slices(cluster.admin) for ref in obj["metadata"]["ownerReferences"]
    }
    assert owners == {("Node", cluster.node_name)}, "the real node's slices are owned by it; the template's by none"
    printed = template(config, cluster.node_name)
    assert not differences(printed, published), "\n".join(differences(printed, published))


def differences(printed: object, stored: object, path: str = "") -> list[str]:
    """Where stored differs from printed, as `path: printed != stored`; quantities compared by value (the server
    stores them in canonical form: the driver's `65536Mi` as `64Gi`)."""
    if isinstance(printed, dict) and isinstance(stored, dict):
        keys = sorted(set(printed) | set(stored))
        return [line for key in keys for line in differences(printed.get(key), stored.get(key), f"{path}.{key}")]
    if isinstance(printed, list) and isinstance(stored, list) and len(printed) == len(stored):
        return [
            line
            for i, pair in enumerate(zip(printed, stored, strict=True))
            for line in differences(*pair, f"{path}[{i}]")
        ]
    if printed == stored or (isinstance(printed, str) and isinstance(stored, str) and same_quantity(printed, stored)):
        return []
    return [f"{path}: {printed!r} != {stored!r}"]


def same_quantity(printed: str, stored: str) -> bool:
    value = quantity(printed)
    return value is not None and value == quantity(stored)
