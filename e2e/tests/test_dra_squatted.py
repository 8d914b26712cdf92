"""A slice name of the node's pool that another node's slice holds before the driver starts (taken first under an
older release's admission policy, which did not pin slice names): the driver leaves that slice alone, never deletes
it (the policy forbids it that, so a delete would be refused for ever), publishes its GPUs under the next free name
within seconds, and says so once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.dra import DRIVER, Driver, delete_slices, driver_slices, slice_devices
from harness.kube import Obj
from harness.waits import until

SQUATTER = "ix-e2e-squatter"  # the node whose driver took the name (no such Node is needed for a slice)
SAID = "is held by a slice that is not the pool's"


def squatting_slice(name: str) -> Obj:
    pool = {"name": SQUATTER, "generation": 1, "resourceSliceCount": 1}
    spec = {"driver": DRIVER, "nodeName": SQUATTER, "pool": pool, "devices": []}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def squatted(cluster: Cluster) -> Iterator[str]:
    """The node's first slice name, held by another node's slice; removed after."""
    name = f"{cluster.node_name}-{DRIVER}"
    cluster.admin.create(squatting_slice(name))
    try:
        yield name
    finally:
        cluster.admin.delete("resourceslice", name, wait=False)


def test_a_slice_name_another_node_took_first_is_left_to_it_and_the_gpus_go_under_the_next_name(
    cluster: Cluster, driver_kubeconfig: Path, squatted: str, tmp_path: Path
) -> None:
    driver = Driver(cluster, tmp_path / "dra-squatted", driver_kubeconfig)
    started = time.monotonic()
    driver.start(wait=False)
    try:

        def own() -> list[Obj]:
            return [s for s in driver_slices(cluster.admin) if s["spec"]["nodeName"] == cluster.node_name]

        until(lambda: len(slice_devices(own())) == 6, 60, "the node's GPUs published", [driver.log])
        took = time.monotonic() - started
        names = [s["metadata"]["name"] for s in own()]
        assert squatted not in names and f"{squatted}-1" in names, names
        assert all(s["spec"]["pool"]["name"] == cluster.node_name for s in own())
        held = cluster.admin.get("resourceslice", squatted)
        assert held["spec"]["nodeName"] == SQUATTER, "the other node's slice is left as it was"
        said = [line for line in driver.log.read_text().splitlines() if SAID in line]
        assert len(said) == 1 and f"ResourceSlice {squatted}," in said[0], said
        assert took < 30, f"published after {took:.0f} s"
    finally:
        driver.stop()
        delete_slices(cluster.admin)
