"""The DRA driver (`ix-device-plugin dra`, a host process over simulated chips, with the chart's ServiceAccount
and RBAC) against the real API server's validation, the real scheduler's allocator and the real kubelet's
DRA manager, with containerd resolving the claims' CDI specs.

The examples of deployments/static/dra-examples.yaml are what the pods run. Scenarios for features still to come
go here too, marked with pytest.xfail and the reason only where the gap is what they observe.
"""

from __future__ import annotations

import copy
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from harness.cluster import CGROUP_ROOT, Cluster
from harness.dra import CHIPS, DRA_VALUES, DRIVER, Driver, chips_seen, claim, minor_is, node_slice, prepare_error
from harness.helm import Helm, load_objects, of_kind
from harness.host import cgroup_mounts, unified_mounts
from harness.images import BUSYBOX_IMAGE
from harness.kube import Kubectl, Obj
from harness.plugin import Chip, fake_ixsmi, ixsmi_calls, node_events
from harness.pods import (
    SHOW_DEVICES,
    STAY,
    busybox_pod,
    phase_is,
    run_and_read,
    running_and_printed,
    shown_devices,
    wait_pod,
)
from harness.waits import until

EXAMPLES = Path(__file__).resolve().parents[2] / "deployments" / "static" / "dra-examples.yaml"


def example(name: str, namespace: str, script: str | None = None) -> list[Obj]:
    """The objects of dra-examples.yaml whose names start with name, in namespace, on the local busybox."""
    objects = []
    for obj in load_objects(EXAMPLES.read_text()):
        if not obj["metadata"]["name"].startswith(name) and obj["kind"] == "Pod":
            continue
        obj = copy.deepcopy(obj)
        obj["metadata"]["namespace"] = namespace
        for container in obj["spec"].get("containers", []):
            container["image"] = BUSYBOX_IMAGE
            container["imagePullPolicy"] = "Never"
            container["command"] = ["sh", "-c", script or SHOW_DEVICES + STAY]
        if obj["kind"] == "Pod":
            obj["spec"]["terminationGracePeriodSeconds"] = 2
        objects.append(obj)
    return objects


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    (found,) = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    return found


def allocated_devices(admin: Kubectl, namespace: str, pod: Obj) -> list[str]:
    """The device names the scheduler allocated to the pod's (first) claim."""
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = admin.get("resourceclaim", status["resourceClaimName"], namespace)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["driver"] for r in results} == {DRIVER} and {r["pool"] for r in results} == {pod["spec"]["nodeName"]}
    return sorted(r["device"] for r in results)


# ------------------------------------------------------------------ the ResourceSlice


def test_the_resource_slice_is_accepted_by_the_api_server(cluster: Cluster, driver: Driver) -> None:
    published = until(lambda: node_slice(cluster), 60, "the ResourceSlice", [driver.log])
    spec = published["spec"]
    assert spec["nodeName"] == cluster.node_name
    assert spec["pool"]["name"] == cluster.node_name
    devices = {device["name"]: device for device in spec["devices"]}
    boards = sorted({f"board-{min(c.minor for c in CHIPS if c.board == chip.board)}" for chip in CHIPS})
    assert sorted(devices) == sorted([f"gpu-{chip.minor}" for chip in CHIPS] + boards)
    for chip in CHIPS:
        attributes = devices[f"gpu-{chip.minor}"]["attributes"]
        assert attributes["uuid"] == {"string": chip.uuid}
        assert attributes["minor"] == {"int": chip.minor}
        assert attributes["productName"] == {"string": "BI-V150"}
        assert devices[f"gpu-{chip.minor}"]["capacity"]["memory"]["value"] == "32Gi"
    board_uuids = {devices[f"gpu-{c.minor}"]["attributes"]["boardUUID"]["string"] for c in CHIPS}
    assert len(board_uuids) == 2
    for board in boards:  # each board drawing on the counters of its two chips and 2 `chips`, in a slice of their own
        consumed = devices[board]["consumesCounters"][0]
        assert consumed["counterSet"] == board and len(consumed["counters"]) == 3
        assert consumed["counters"]["chips"] == {"value": "2"}
    counter_sets = [
        counter_set["name"]
        for s in cluster.admin.items("resourceslices")
        if s["spec"]["driver"] == DRIVER
        for counter_set in s["spec"].get("sharedCounters") or []
    ]
    assert sorted(counter_sets) == boards


def test_the_api_server_refuses_a_slice_the_driver_must_never_write(cluster: Cluster, driver: Driver) -> None:
    """The server's own validation is what the driver's slices pass: a device name that is no DNS label fails."""
    broken = copy.deepcopy(node_slice(cluster))
    for field in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        broken["metadata"].pop(field, None)
    broken["metadata"] = {"name": "e2e-invalid-slice"}
    broken["spec"]["devices"][0]["name"] = "GPU_0"
    with pytest.raises(AssertionError, match="Invalid value"):
        cluster.admin.create(broken, "--dry-run=server")


# ------------------------------------------------------------------ claims through the scheduler and the kubelet


def test_a_claim_template_pod_is_scheduled_prepared_and_sees_its_chip(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    objects = example("dra-one-gpu", namespace)
    admin.create(named(objects, "ResourceClaimTemplate", "one-iluvatar-gpu"))
    pod, output = run_and_read(admin, namespace, named(objects, "Pod", "dra-one-gpu"))
    (chip,) = chips_seen(output)
    assert allocated_devices(admin, namespace, pod) == [f"gpu-{chip.minor}"]
    spec_files = sorted(path.name for path in cluster.cdi_dir.glob(f"{DRIVER}-claim_*.yaml"))
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim_uid = admin.get("resourceclaim", claim_name, namespace)
    assert spec_files == [f"{DRIVER}-claim_{claim_uid['metadata']['uid']}.yaml"]
    # status.devices, written with the chart's RBAC (associated-node:patch of resourceclaims/driver, which 1.37
    # asks for) from a token bound to a pod on the node: the real API server accepts the entry as written.
    told = until(
        lambda: admin.get("resourceclaim", claim_name, namespace)["status"].get("devices"),
        30,
        "the claim's status.devices",
        [driver.log],
    )
    assert [(entry["driver"], entry["pool"], entry["device"]) for entry in told] == [
        (DRIVER, cluster.node_name, f"gpu-{chip.minor}")
    ]
    assert told[0]["data"]["uuid"] == chip.uuid


def test_a_whole_board_claim_gets_both_chips_of_one_board(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    objects = example("dra-whole-board", namespace)
    admin.create(named(objects, "ResourceClaimTemplate", "whole-iluvatar-board"))
    pod, output = run_and_read(admin, namespace, named(objects, "Pod", "dra-whole-board"))
    chips = chips_seen(output)
    assert len(chips) == 2 and chips[0].board == chips[1].board
    assert allocated_devices(admin, namespace, pod) == sorted(f"gpu-{c.minor}" for c in chips)


def claim_template(name: str, device_class: str) -> Obj:
    """A ResourceClaimTemplate of one device of device_class."""
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def told_every_chip(admin: Kubectl, namespace: str, pod: Obj, output: str) -> set[int]:
    """The minors of the chips the pod's container got: every one of them (and no other) in both visible-devices
    variables, and every allocated device in both replica variables; each once."""
    nodes, env = shown_devices(output)
    minors = {int(path.removeprefix("/dev/iluvatar")) for path in nodes if path.startswith("/dev/iluvatar")}
    held = {chip.uuid for chip in CHIPS if chip.minor in minors}
    devices = set()
    for status in pod["status"]["resourceClaimStatuses"]:
        claim = admin.get("resourceclaim", status["resourceClaimName"], namespace)
        devices |= {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
    by_minor = {chip.minor: chip.uuid for chip in CHIPS}
    replicas = {by_minor[int(device.split("-")[1])] for device in devices}  # a board is named by its first chip
    for variables, expected in (
        (("IX_VISIBLE_DEVICES", "ILUVATAR_COREX_VISIBLE_DEVICES"), held),
        (("IX_REPLICA_DEVICES", "ILUVATAR_COREX_REPLICA_DEVICES"), replicas),
    ):
        for variable in variables:
            listed = env.get(variable, "").split(",")
            assert len(listed) == len(set(listed)) and set(listed) == expected, f"{variable}: {output}"
    return minors


def test_a_container_with_two_claims_and_one_with_three_is_told_every_chip(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    """Each claim has its own CDI spec and containerd's CDI library keeps the last value of a variable: the
    container still sees every chip it holds in every GPU variable, with two claims (two chips) and with three
    (a whole board and the other board's two chips)."""
    admin.create([claim_template("chip", DRIVER), claim_template("board", f"board.{DRIVER}")], "-n", namespace)
    for name, templates, chips in (("two-claims", ["chip", "chip"], 2), ("three-claims", ["board", "chip", "chip"], 4)):
        claims = [{"name": f"gpu-{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
        pod, output = run_and_read(admin, namespace, busybox_pod(name, SHOW_DEVICES + STAY, claims=claims))
        assert len(told_every_chip(admin, namespace, pod, output)) == chips, output
        admin.delete("pod", name, namespace)


def test_two_pods_naming_one_claim_share_its_chip(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    objects = example("dra-shared", namespace)
    admin.create(of_kind(objects, "ResourceClaim"))
    first, second = of_kind(objects, "Pod")
    _, output_a = run_and_read(admin, namespace, first)
    _, output_b = run_and_read(admin, namespace, second)
    assert chips_seen(output_a) == chips_seen(output_b)
    claim = admin.get("resourceclaim", "shared-iluvatar-gpu", namespace)
    assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["dra-shared-a", "dra-shared-b"]


def test_an_unhealthy_chip_is_tainted_and_the_scheduler_keeps_off_it(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    broken = [Chip(c.uuid, c.minor, c.board, ("ECC",)) if c.minor == 3 else c for c in CHIPS]
    driver.set_chips(broken)
    try:

        def tainted() -> list[Any] | None:
            devices = {d["name"]: d for d in node_slice(cluster)["spec"]["devices"]}
            return devices.get("gpu-3", {}).get("taints")

        found = until(tainted, 30, "gpu-3 tainted in the ResourceSlice", [driver.log])
        (taint,) = [t for t in found if t["key"] != f"{DRIVER}/healing"]  # beside it: what self-healing does
        assert taint["key"] == f"{DRIVER}/unhealthy" and taint["effect"] == "NoSchedule"
        template = named(example("dra-whole-board", namespace), "ResourceClaimTemplate", "whole-iluvatar-board")
        template["metadata"]["name"] = "all-chips"
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 4
        del template["spec"]["spec"]["devices"]["constraints"]
        admin.create(template)
        pod = named(example("dra-one-gpu", namespace), "Pod", "dra-one-gpu")
        pod["metadata"]["name"] = "wants-all"
        pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "all-chips"
        admin.create(pod)

        def unschedulable(current: Obj) -> bool:
            conditions = current.get("status", {}).get("conditions", [])
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

        wait_pod(admin, namespace, "wants-all", unschedulable, "Unschedulable (a tainted chip)", timeout=60)
    finally:
        driver.set_chips(CHIPS)
    until(lambda: not tainted(), 30, "gpu-3 untainted", [driver.log])
    wait_pod(admin, namespace, "wants-all", phase_is("Running"), "Running once the chip is healthy", timeout=120)


def test_a_pod_asking_for_the_extended_resource_is_served_by_dra(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver, dra_objects: list[Obj], tmp_path: Path
) -> None:
    """DeviceClass extendedResourceName (the chart's dra.extendedResourceName): an unchanged `iluvatar.com/gpu: 1`
    pod gets, through a claim the scheduler makes (DRAExtendedResource), what the device plugin would give it
    on this node: a whole board, the node's ix-config not splitting boards.
    """
    helm = Helm(cluster.binaries["helm"], tmp_path)
    values = {**DRA_VALUES, "dra": {"enabled": True, "extendedResourceName": "iluvatar.com/gpu"}}
    classes = of_kind(helm.template(values), "DeviceClass")
    (device_class,) = [c for c in classes if c["spec"].get("extendedResourceName")]
    assert device_class["spec"]["extendedResourceName"] == "iluvatar.com/gpu"
    assert device_class["metadata"]["name"] == f"extended-resource.{DRIVER}"
    admin.apply(device_class)
    try:
        pod = busybox_pod("extended", SHOW_DEVICES + STAY, gpus=1)
        current, output = run_and_read(admin, namespace, pod)
        chips = chips_seen(output)
        assert len(chips) == 2 and chips[0].board == chips[1].board
        claims = admin.items("resourceclaims", namespace)
        assert len(claims) == 1
        results = claims[0]["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["device"]) for r in results] == [(DRIVER, f"board-{chips[0].minor}")]
        assert current["status"]["extendedResourceClaimStatus"]["resourceClaimName"] == claims[0]["metadata"]["name"]
    finally:
        admin.delete("DeviceClass", device_class["metadata"]["name"], wait=False)


# ------------------------------------------------------------------ restarts


def test_after_a_reboot_the_pods_container_restarts_with_its_chip(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    """Kubelet and driver stopped, the CDI directory wiped (a tmpfs after a reboot), both started again, the
    pod's container restarted: it must get its chip again from the claim prepared before the reboot.
    """
    objects = example("dra-one-gpu", namespace)
    admin.create(named(objects, "ResourceClaimTemplate", "one-iluvatar-gpu"))
    pod = named(objects, "Pod", "dra-one-gpu")
    pod["spec"]["restartPolicy"] = "Always"
    _, output = run_and_read(admin, namespace, pod)
    (chip,) = chips_seen(output)
    cluster.stop_kubelet()
    driver.stop()
    try:
        for spec in cluster.cdi_dir.glob(f"{DRIVER}-*.yaml"):
            spec.unlink()
        driver.start(wait=False)
    finally:
        cluster.start_kubelet()
    cluster.wait_node_ready()
    assert driver.run is not None
    driver.run.wait_ready(90)
    kill_container(cluster, namespace, "dra-one-gpu")

    def settled(current: Obj) -> bool:
        status = current.get("status", {}).get("containerStatuses", [{}])[0]
        restarted = status.get("restartCount", 0) >= 1 and "running" in status.get("state", {})
        return restarted or "CDI" in status.get("state", {}).get("waiting", {}).get("message", "")

    current = wait_pod(admin, namespace, "dra-one-gpu", settled, "container restarted", timeout=90, logs=[driver.log])
    waiting = current["status"]["containerStatuses"][0]["state"].get("waiting")
    assert not waiting, f"the container could not restart after the reboot: {waiting}"
    logs = admin("logs", "dra-one-gpu", "-n", namespace)
    assert chips_seen(logs) == [chip]


def kill_container(cluster: Cluster, namespace: str, pod: str) -> None:
    """SIGKILL the pod's container process (as a crash would), found through the pod's cgroups."""
    uid = cluster.admin.get("pod", pod, namespace)["metadata"]["uid"]
    pids: set[str] = set()
    for mount in [*cgroup_mounts(), *unified_mounts()]:
        for procs in mount.glob(f"{CGROUP_ROOT}/kubepods*/**/pod{uid}/*/cgroup.procs"):
            pids |= set(procs.read_text().split())
    killed = [pid for pid in pids if Path(f"/proc/{pid}/comm").read_text().strip() == "sh"]
    for pid in killed:
        os.kill(int(pid), signal.SIGKILL)
    assert killed, f"no container process found for {namespace}/{pod}"


# ------------------------------------------------------------------ admin access and health


def test_an_admin_access_claim_reaches_a_chip_in_use(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    """DRAAdminAccess: a monitoring pod in an admin namespace claims a chip another pod holds, with adminAccess."""
    objects = example("dra-one-gpu", namespace)
    admin.create(named(objects, "ResourceClaimTemplate", "one-iluvatar-gpu"))
    _, output = run_and_read(admin, namespace, named(objects, "Pod", "dra-one-gpu"))
    (chip,) = chips_seen(output)
    admin("label", "namespace", namespace, "resource.kubernetes.io/admin-access=true")
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "monitor", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "adminAccess": True,
                            "selectors": [
                                {"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{chip.uuid}"'}}
                            ],
                        },
                    }
                ]
            }
        },
    }
    admin.create(claim)
    monitor = busybox_pod("monitor", SHOW_DEVICES + STAY, claims=[{"name": "gpu", "resourceClaimName": "monitor"}])
    admin.create(monitor, "-n", namespace)

    def settled(pod: Obj) -> bool:
        return pod.get("status", {}).get("phase") == "Running" or bool(prepare_error(admin, namespace, "monitor"))

    wait_pod(admin, namespace, "monitor", settled, "Running, or refused by the driver", timeout=90, logs=[driver.log])
    assert not prepare_error(admin, namespace, "monitor")
    wait_pod(admin, namespace, "monitor", running_and_printed(admin, namespace), "printed its devices")
    assert chips_seen(admin("logs", "monitor", "-n", namespace)) == [chip]


def test_a_chips_health_reaches_the_pod_status(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    """The driver's DRAResourceHealth stream, which the kubelet opens because the registration lists it, carries
    a chip's health to the pod's allocatedResourcesStatus (ResourceHealthStatus).
    """
    objects = example("dra-one-gpu", namespace)
    admin.create(named(objects, "ResourceClaimTemplate", "one-iluvatar-gpu"))
    _, output = run_and_read(admin, namespace, named(objects, "Pod", "dra-one-gpu"))
    (chip,) = chips_seen(output)
    driver.set_chips([Chip(c.uuid, c.minor, c.board, ("ECC",)) if c == chip else c for c in CHIPS])
    try:

        def unhealthy(pod: Obj) -> bool:
            statuses = pod["status"]["containerStatuses"][0].get("allocatedResourcesStatus") or []
            return any(r.get("health") == "Unhealthy" for s in statuses for r in s.get("resources", []))

        wait_pod(
            admin,
            namespace,
            "dra-one-gpu",
            unhealthy,
            "allocatedResourcesStatus Unhealthy",
            timeout=60,
            logs=[driver.log],
        )
        driver.set_chips(CHIPS)

        def healthy(pod: Obj) -> bool:
            statuses = pod["status"]["containerStatuses"][0].get("allocatedResourcesStatus") or []
            return [r.get("health") for s in statuses for r in s.get("resources", [])] == ["Healthy"]

        wait_pod(admin, namespace, "dra-one-gpu", healthy, "allocatedResourcesStatus Healthy again", timeout=60)
    finally:
        driver.set_chips(CHIPS)


# ------------------------------------------------------------------ self-healing


def test_a_chip_with_an_xid_is_reset_once_its_claim_is_gone_and_a_new_claim_takes_it(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver, tmp_path: Path
) -> None:
    """An XID on a chip a pod's claim holds taints it; nothing is reset until the pod is deleted (the kubelet
    unprepares the claim); then the chip is reset (a fake ixsmi), the taint goes, a new claim takes the chip, and
    `kubectl describe node` shows each step."""
    ixsmi = fake_ixsmi(tmp_path / "ixsmi")
    driver.configure(flags=["--ixsmi-path", str(ixsmi)])
    try:
        holder = busybox_pod("holder", SHOW_DEVICES + STAY, claims=[{"name": "gpu", "resourceClaimName": "holds"}])
        admin.create([claim("holds", selector=minor_is(3))], "-n", namespace)
        _, output = run_and_read(admin, namespace, holder)
        (chip,) = chips_seen(output)
        driver.set_chips([replace(c, xids=(48,)) if c == chip else c for c in CHIPS])

        def taints() -> list[Any]:
            devices = {d["name"]: d for d in node_slice(cluster)["spec"]["devices"]}
            return devices.get("gpu-3", {}).get("taints") or []

        until(taints, 30, "gpu-3 tainted", [driver.log])
        waiting = f"held by claim {namespace}/holds"
        until(
            lambda: any(waiting in e["message"] for e in node_events(admin, cluster.node_name)),
            30,
            "the chip waits for its claim",
            [driver.log],
        )
        assert ixsmi_calls(ixsmi) == []
        admin.delete("pod", "holder", namespace)
        admin.delete("resourceclaim", "holds", namespace)
        until(lambda: not taints(), 60, "gpu-3 untainted after its reset", [driver.log])
        assert ixsmi_calls(ixsmi) == [f"-r -i {chip.uuid}"]
        taker = busybox_pod("taker", SHOW_DEVICES + STAY, claims=[{"name": "gpu", "resourceClaimName": "takes"}])
        admin.create([claim("takes", selector=minor_is(3))], "-n", namespace)
        _, output = run_and_read(admin, namespace, taker)
        assert chips_seen(output) == [chip]
        described = admin("describe", "node", cluster.node_name)
        for reason in ("GPUXidError", "GPUUnhealthy", "GPUHealingWaiting", "GPUHealingReset", "GPUHealthy"):
            assert reason in described, described[-3000:]
        assert f"GPU 3 ({chip.uuid}): XID 48" in described
        steps = {e["reason"] for e in node_events(admin, cluster.node_name) if chip.uuid in e["message"]}
        assert {"GPUHealingReset", "GPUHealthy"} <= steps
        assert driver.run is not None and "Forbidden" not in driver.run.process.log_text()
    finally:
        driver.set_chips(CHIPS)
        driver.configure()
