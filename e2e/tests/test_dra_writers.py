"""What other writers do to the DRA driver's ResourceSlices on the real cluster: the garbage collector of
kube-controller-manager when the Node is deleted and registered again (a new UID), and a user who removes the
slices' `app.kubernetes.io/managed-by` label.

This module runs its own driver (module scope) and restarts the kubelet; it deletes the Node, which the kubelet
registers again at its start with a new UID.
"""

from __future__ import annotations

from harness.cluster import Cluster
from harness.dra import CHIPS, OWN_SLICES, Driver, driver_slices, node_slice, slice_devices
from harness.plugin import Chip
from harness.waits import stays, until

QUIET = 15.0  # seconds the slices are watched for writes once settled


def owners(cluster: Cluster) -> list[list[str]]:
    """The owner UIDs of each of the driver's slices."""
    return [[o["uid"] for o in s["metadata"].get("ownerReferences") or []] for s in driver_slices(cluster.admin)]


def identities(cluster: Cluster) -> list[tuple[str, str, str]]:
    """(name, UID, resourceVersion) of each of the driver's slices: a delete and create changes the UID."""
    return [
        (s["metadata"]["name"], s["metadata"]["uid"], s["metadata"]["resourceVersion"])
        for s in driver_slices(cluster.admin)
    ]


def test_a_node_registered_again_owns_the_slices_and_the_garbage_collector_leaves_them(
    cluster: Cluster, driver: Driver
) -> None:
    until(lambda: len(slice_devices(driver_slices(cluster.admin))) == 6, 60, "the slices", [driver.log])
    old = cluster.admin.get("node", cluster.node_name)["metadata"]["uid"]
    assert owners(cluster) == [[old], [old]]
    cluster.stop_kubelet()
    try:
        cluster.admin("delete", "node", cluster.node_name, "--wait=true", timeout=60)
    finally:
        cluster.start_kubelet()  # it registers the Node again: a new UID
    new = cluster.wait_node_ready()["metadata"]["uid"]
    assert new != old

    def followed() -> bool:
        return owners(cluster) == [[new], [new]] and len(slice_devices(driver_slices(cluster.admin))) == 6

    until(followed, 90, "the slices owned by the new Node", [driver.log])
    settled = identities(cluster)
    stays(  # the garbage collector has its look meanwhile
        lambda: identities(cluster) == settled and owners(cluster) == [[new], [new]],
        QUIET,
        "the slices neither deleted nor written again",
        [driver.log],
        interval=1,
    )
    assert f"was re-created (UID {new}, was {old})" in driver.log.read_text()


def test_a_slice_whose_label_was_removed_is_adopted_and_still_follows_health(cluster: Cluster, driver: Driver) -> None:
    name = until(lambda: node_slice(cluster), 60, "the ResourceSlice", [driver.log])["metadata"]["name"]
    key = OWN_SLICES.split("=")[0]
    cluster.admin("label", "resourceslice", name, f"{key}-")

    def labelled() -> bool:
        return node_slice(cluster)["metadata"].get("labels", {}).get(key) == OWN_SLICES.split("=")[1]

    until(labelled, 30, "the label put back", [driver.log])
    assert f"ResourceSlice {name}" in driver.log.read_text() and "had lost its label" in driver.log.read_text()
    driver.set_chips([Chip(c.uuid, c.minor, c.board, ("ECC",)) if c.minor == 3 else c for c in CHIPS])
    try:
        until(lambda: slice_devices([node_slice(cluster)])["gpu-3"].get("taints"), 30, "gpu-3 tainted", [driver.log])
    finally:
        driver.set_chips(CHIPS)
    until(lambda: not slice_devices([node_slice(cluster)])["gpu-3"].get("taints"), 30, "gpu-3 healthy", [driver.log])
