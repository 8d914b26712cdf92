"""A rolling update of the DRA driver on the real node, as the DaemonSet runs it (maxSurge 1, maxUnavailable 0,
sockets named per pod by POD_UID): the new driver, with other ix-config (`--replicas 2`), starts beside the old
one, the old one is stopped (or killed) once the new one is ready.

What the API server and the kubelet see: one writer of the node's ResourceSlices at a time, no write while
nothing changes, the slices never missing, the new content published at the handover, and a claim the old
driver prepared unprepared by the new one. The figures (writes per minute during the overlap, the longest gap,
the handover time) are printed and written to the log directory.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from harness.cluster import Cluster
from harness.dra import CHIPS, DRIVER, chips_seen, claim, delete_slices, minor_is, prepare_error
from harness.kube import Kubectl
from harness.plugin import PluginRun, fake_ixsmi, ixsmi_calls, ixsmi_done, start_dra_driver
from harness.pods import SHOW_DEVICES, STAY, busybox_pod, phase_is, run_and_read, running_and_printed, wait_pod
from harness.slicewatch import SAMPLE, SliceRecorder
from harness.waits import until

# POD_UID of each pod, as the downward API gives it (the cluster's kubelet root is as long as MicroK8s's).
OLD_POD, NEW_POD = "5f0c3a9e-2b71-4d6e-9a3f-0c8b7e1d2a40", "a9e41b07-6c2d-4f85-b3e0-7d1c9f2a6b18"
REST = 20.0  # seconds each pod is watched at rest
RESET_SECONDS = 16  # the fake ixsmi's reset: long enough for the kubelet to ask both drivers while it runs


def unshared(devices: dict[str, Any]) -> bool:
    """The old driver's content: 4 chips and 2 boards, none shared."""
    return len(devices) == 6 and not any(d.get("allowMultipleAllocations") for d in devices.values())


def shared(devices: dict[str, Any]) -> bool:
    """The new driver's content (`--replicas 2`): every device shared."""
    return bool(devices) and all(d.get("allowMultipleAllocations") for d in devices.values())


def holder_pod(namespace: str, name: str = "holder", claim_name: str = "held") -> dict[str, Any]:
    pod = busybox_pod(name, SHOW_DEVICES + STAY, claims=[{"name": "gpu", "resourceClaimName": claim_name}])
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["terminationGracePeriodSeconds"] = 2
    return pod


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_rolling_update_with_changed_config_has_one_writer_no_gap_and_no_write_at_rest(
    cluster: Cluster,
    admin: Kubectl,
    namespace: str,
    driver_kubeconfig: Path,
    tmp_path: Path,
    log_dir: Path,
    how: str,
) -> None:
    delete_slices(admin)
    old = start_dra_driver(
        cluster, tmp_path / "old", f"dra-update-{how}-old", driver_kubeconfig, extra=["--pod-uid", OLD_POD]
    )
    new: PluginRun | None = None
    try:
        old.wait_ready(90)
        held = claim("held")
        held["metadata"]["namespace"] = namespace
        admin.create(held)
        _, output = run_and_read(admin, namespace, holder_pod(namespace))
        (chip,) = chips_seen(output)
        claim_uid = admin.get("resourceclaim", "held", namespace)["metadata"]["uid"]
        assert f"prepared claim {namespace}/held" in old.process.log_text()
        with SliceRecorder(cluster) as recorder:
            until(lambda: recorder.samples and recorder.samples[-1].devices, 10, "a first sample")
            assert unshared(recorder.samples[-1].devices or {})
            overlap_began = time.monotonic()
            new = start_dra_driver(
                cluster, tmp_path / "new", f"dra-update-{how}-new", driver_kubeconfig,
                extra=["--pod-uid", NEW_POD, "--replicas", "2"],
            )  # fmt: skip
            new.wait_ready(90)  # on standby, and ready: the rollout deletes the old pod only once the new one is
            standby = f"/node-role.lock (publishing the ResourceSlices of node {cluster.node_name}); this pod serves"
            assert "standby: another pod holds " in new.process.log_text() and standby in new.process.log_text()
            time.sleep(REST)
            overlap_ended = time.monotonic()
            if how == "stopped":
                assert old.stop() == 0
            else:
                old.process.kill()
            handed_over = until(
                lambda: recorder.first_sample(shared, overlap_ended), 30, "the new content", [new.process.log]
            )
            time.sleep(3)  # the handover's writes (a pool of several slices) are over
            rest_began = time.monotonic()
            time.sleep(REST)
            rest_ended = time.monotonic()
        admin.delete("pod", "holder", namespace)
        unprepared = f"unprepared claim {namespace}/held"
        until(lambda: unprepared in new.process.log_text(), 60, "the new driver's unprepare", [new.process.log])
        assert not (cluster.cdi_dir / f"{DRIVER}-claim_{claim_uid}.yaml").exists()
        overlap = recorder.writes_between(overlap_began, overlap_ended)
        handover = recorder.writes_between(overlap_ended, rest_began)
        at_rest = recorder.writes_between(rest_began, rest_ended)
        figures = {
            "how": how,
            "chip": chip.uuid,
            "overlap_seconds": round(overlap_ended - overlap_began, 1),
            "overlap_slice_writes": len(overlap),
            "overlap_slice_writes_per_minute": round(len(overlap) * 60 / (overlap_ended - overlap_began), 1),
            "handover_seconds": round(handed_over - overlap_ended, 2),
            "handover_slice_writes": [f"{write.type} {write.name}" for write in handover],
            "slice_writes_at_rest_after": len(at_rest),
            "rest_seconds": round(rest_ended - rest_began, 1),
            "longest_gap_seconds": round(recorder.longest_gap(), 2),
            "samples": len(recorder.samples),
            "sample_interval_seconds": SAMPLE,
        }
        (log_dir / f"dra-rolling-update-{how}.json").write_text(json.dumps(figures, indent=2))
        print(f"rolling update ({how}): {json.dumps(figures)}")
        assert recorder.errors == []
        assert overlap == [], f"{len(overlap)} slice writes while both drivers ran, the first: {overlap[:6]}"
        assert at_rest == [], f"{len(at_rest)} slice writes at rest after the handover, the first: {at_rest[:6]}"
        assert recorder.longest_gap() == 0, "the node's slices were missing"
        assert handed_over - overlap_ended < 5
        assert f"on standby: publishing the ResourceSlices of node {cluster.node_name}" in new.process.log_text()
        assert len(recorder.samples) > (rest_ended - overlap_began) / SAMPLE / 2
    finally:
        old.stop()
        if new is not None:
            new.stop()
        delete_slices(admin)


def test_a_rolling_update_during_a_reset_prepares_no_claim_on_the_chip_until_it_is_done(
    cluster: Cluster, admin: Kubectl, namespace: str, driver_kubeconfig: Path, tmp_path: Path
) -> None:
    """An XID 48 (in the old driver's simulated devices file only) makes the old driver, acting for the node,
    reserve the chip in the node-health record and reset it through a slow ixsmi. While the reset runs, a claim and
    an admin-access claim on that chip (tolerating its taint, so that the scheduler allocates them) are refused by
    the old driver; then the new driver starts beside it, on standby, and the kubelet asks it instead: it refuses
    them too, knowing the reservation and the XID from the record alone. No pod is Running and no driver prepared a
    claim until the reset is done; then the new driver prepares both and their containers see the chip."""
    delete_slices(admin)
    ixsmi = fake_ixsmi(tmp_path / "ixsmi", seconds=RESET_SECONDS)
    flags = ["--ixsmi-path", str(ixsmi)]
    old = start_dra_driver(
        cluster, tmp_path / "old", "dra-update-reset-old", driver_kubeconfig, extra=["--pod-uid", OLD_POD, *flags]
    )
    new: PluginRun | None = None
    pods = {"user": claim("user", selector=minor_is(3), tolerate_taints=True)}
    pods["monitor"] = claim("monitor", selector=minor_is(3), admin_access=True, tolerate_taints=True)
    chip = CHIPS[3]

    def refused_by(driver: PluginRun, name: str) -> bool:
        """The driver's log says it refused the claim for the chip's reservation (the claim tolerates the XID's
        taint, and admin access looks at any chip: the reset in progress is what stops both)."""
        refusal = f"NodePrepareResources: claim {namespace}/{name} "
        why = "reserved for a GPU reset"
        lines = driver.process.log_text().splitlines()
        return any(refusal in line and chip.uuid in line and why in line for line in lines)

    def refused_while_resetting(driver: PluginRun, which: str) -> None:
        for name in pods:
            until(
                lambda name=name: refused_by(driver, name),
                RESET_SECONDS,
                f"the {which} driver refusing {name} while the reset runs",
                [driver.process.log],
            )
        assert ixsmi_done(ixsmi) == [], f"the reset ended before the {which} driver refused both: nothing proved"

    try:
        old.wait_ready(90)
        old.set_chips([replace(c, xids=(48,)) if c == chip else c for c in CHIPS])
        until(lambda: ixsmi_calls(ixsmi), 30, "the old driver's reset began", [old.process.log])
        admin("label", "namespace", namespace, "resource.kubernetes.io/admin-access=true")
        for name, wanted in pods.items():
            wanted["metadata"]["namespace"] = namespace
            admin.create(wanted)
            admin.create(holder_pod(namespace, name, name))
        refused_while_resetting(old, "old")
        new = start_dra_driver(
            cluster, tmp_path / "new", "dra-update-reset-new", driver_kubeconfig, extra=["--pod-uid", NEW_POD, *flags]
        )
        new.wait_ready(90)
        refused_while_resetting(new, "new")
        assert "reserved for a GPU reset" in prepare_error(admin, namespace, "monitor")  # what its Events say
        for name in pods:
            assert chip.uuid in prepare_error(admin, namespace, name)
            assert phase_is("Pending")(admin.get("pod", name, namespace))
            for driver in (old, new):
                assert f"prepared claim {namespace}/{name}" not in driver.process.log_text()
        for name in pods:
            wait_pod(admin, namespace, name, running_and_printed(admin, namespace), "Running after the reset", 60)
            assert chips_seen(admin("logs", name, "-n", namespace)) == [chip]
            assert f"prepared claim {namespace}/{name}" in new.process.log_text()
        assert ixsmi_done(ixsmi) == ixsmi_calls(ixsmi) == [f"-r -i {chip.uuid}"]
    finally:
        for name in pods:  # unprepared while a driver runs, else the kubelet keeps the pods
            admin.delete("pod", name, namespace)
        old.stop()
        if new is not None:
            new.stop()
        delete_slices(admin)
