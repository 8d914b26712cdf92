"""What each container of a pod is told, on the real kubelet and containerd: every container sees exactly the chips it
holds (its device nodes, and the same chips in IX_VISIBLE_DEVICES, ILUVATAR_COREX_VISIBLE_DEVICES and the replica
variables), whatever kind of claim gives them: a prioritized list's subrequest, a chip whose taint the request
tolerates, the scheduler's claim for `iluvatar.com/gpu` in several containers, claims made on their own beside
the pod's own, and several requests of one claim referenced by different containers.

The kubelet 1.37 hands a container its claims' CDI devices in no fixed order between claims (a Go map): a
scenario whose shape the driver could only get right by that order would pass or fail by chance, so each pod is
checked in every container, and the scenarios with several claims per container run their pod twice.
These are ports to this driver of upstream v1.37.2 scenarios (test/e2e/dra/dra.go): "selects the first subrequest
that can be satisfied", "NoSchedule can be tolerated", "must run a pod with explicit extended resource with three
containers one resource each", "must map configs and devices to the right containers", and the extended-resource
pods whose init container reuses the chips of the containers after it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from harness.cluster import Cluster
from harness.dra import CHIPS, DRIVER, Driver, claim, minor_is, node_slice
from harness.images import BUSYBOX_IMAGE
from harness.kube import Kubectl, Obj
from harness.pods import SHOW_DEVICES, STAY, shown_devices, wait_pod
from harness.waits import until

BY_MINOR = {chip.minor: chip for chip in CHIPS}
BOARD_MINORS = {"board-0": {0, 1}, "board-2": {2, 3}}


def container(
    name: str,
    claims: list[dict[str, str]] | None = None,
    gpus: int | None = None,
    resource: str = "iluvatar.com/gpu",
    stays: bool = True,
) -> Obj:
    """A busybox container printing what it was given (then staying, or ending), referencing claims or asking
    for a number of GPUs as resource."""
    spec: Obj = {"name": name, "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never"}
    spec["command"] = ["sh", "-c", SHOW_DEVICES + (STAY if stays else "")]
    if claims is not None:
        spec["resources"] = {"claims": claims}
    if gpus is not None:
        spec["resources"] = {"limits": {resource: str(gpus)}}
    return spec


def pod(name: str, containers: list[Obj], claims: list[Obj] | None = None, init: list[Obj] | None = None) -> Obj:
    spec: Obj = {"containers": containers, "restartPolicy": "Never", "terminationGracePeriodSeconds": 2}
    if claims:
        spec["resourceClaims"] = claims
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def template(name: str, requests: list[str]) -> Obj:
    """A ResourceClaimTemplate of one chip per request."""
    made = {"name": "x", "exactly": {"deviceClassName": DRIVER}}
    spec = {"devices": {"requests": [{**made, "name": request} for request in requests]}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": spec}}  # fmt: skip


def with_requests(made: Obj, requests: list[str]) -> Obj:
    """A claim of claim()'s with one chip per request instead of its one request `gpu`."""
    (first,) = made["spec"]["devices"]["requests"]
    made["spec"]["devices"]["requests"] = [{**first, "name": request} for request in requests]
    return made


def told(admin: Kubectl, namespace: str, pod_name: str, name: str) -> set[int]:
    """The minors of the chips the container holds (its device nodes), checked to be exactly what all four GPU
    variables tell it."""
    output = admin("logs", pod_name, "-n", namespace, "-c", name)
    nodes, env = shown_devices(output)
    minors = {int(path.removeprefix("/dev/iluvatar")) for path in nodes if path.startswith("/dev/iluvatar")}
    uuids = {BY_MINOR[minor].uuid for minor in minors}
    for variable in ("IX_VISIBLE_DEVICES", "ILUVATAR_COREX_VISIBLE_DEVICES"):
        listed = env.get(variable, "").split(",")
        assert len(listed) == len(set(listed)) and set(listed) == uuids, f"{name}: {variable}: {output}"
    for variable in ("IX_REPLICA_DEVICES", "ILUVATAR_COREX_REPLICA_DEVICES"):
        named = {item.split("::")[0] for item in env.get(variable, "").split(",")}
        assert named <= uuids and named, f"{name}: {variable}: {output}"  # a board is named by its first chip
    return minors


def run(admin: Kubectl, namespace: str, manifest: Obj, driver: Driver, timeout: float = 120) -> Obj:
    """Create the pod and wait until every container has printed what it was given."""
    admin.create(manifest, "-n", namespace)
    name = manifest["metadata"]["name"]
    every = [c["name"] for c in [*manifest["spec"].get("initContainers", []), *manifest["spec"]["containers"]]]

    def printed(current: Obj) -> bool:
        if current.get("status", {}).get("phase") != "Running":
            return False
        return all("END" in admin("logs", name, "-n", namespace, "-c", c, timeout=30) for c in every)

    return wait_pod(admin, namespace, name, printed, "every container printed its devices", timeout, [driver.log])


def minors_of(admin: Kubectl, namespace: str, claim_name: str, request: str | None = None) -> set[int]:
    """The chips the scheduler allocated to the claim (to one of its requests)."""
    made = admin.get("resourceclaim", claim_name, namespace)
    found: set[int] = set()
    for result in made["status"]["allocation"]["devices"]["results"]:
        if request is None or result["request"].split("/")[0] == request:
            device = result["device"]
            found |= BOARD_MINORS.get(device) or {int(device.removeprefix("gpu-"))}
    return found


def generated(current: Obj, entry: str) -> str:
    """The name of the claim the pod's template entry made."""
    return next(s["resourceClaimName"] for s in current["status"]["resourceClaimStatuses"] if s["name"] == entry)


# ------------------------------------------------------------------ one claim


def test_a_subrequest_the_scheduler_picked_reaches_the_container_referencing_its_request(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    """A request with firstAvailable (5 chips, else 2, else 1) on 4 chips: the scheduler allocates
    `request-1/sub-request-2`; the container references `request-1` and gets both chips."""
    picked = claim("pick")
    subrequests = [
        {"name": f"sub-request-{index}", "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count}
        for index, count in ((1, 5), (2, 2), (3, 1))
    ]
    picked["spec"]["devices"]["requests"] = [{"name": "request-1", "firstAvailable": subrequests}]
    admin.create(picked, "-n", namespace)
    references = [{"name": "gpu", "request": "request-1"}]
    run(admin, namespace, pod("pick", [container("main", references)], [{"name": "gpu", "resourceClaimName": "pick"}]),
        driver)  # fmt: skip
    results = admin.get("resourceclaim", "pick", namespace)["status"]["allocation"]["devices"]["results"]
    assert [r["request"] for r in results] == ["request-1/sub-request-2"] * 2
    assert told(admin, namespace, "pick", "main") == minors_of(admin, namespace, "pick") and len(results) == 2


def test_a_tainted_chip_a_request_tolerates_is_prepared_and_runs(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver
) -> None:
    """A burn-in job: chip 3 is over temperature, tainted; a claim tolerating every taint and selecting it is
    allocated it, and the pod runs on it (the driver used to refuse the prepare, leaving it ContainerCreating)."""

    def taints() -> list[Any]:
        devices = {d["name"]: d for d in node_slice(cluster)["spec"]["devices"]}
        return devices.get("gpu-3", {}).get("taints") or []

    driver.set_chips([replace(c, health=("OverTemp",)) if c.minor == 3 else c for c in CHIPS])
    try:
        found = until(taints, 30, "gpu-3 tainted", [driver.log])
        (taint,) = [t for t in found if t["key"] == "gpu.iluvatar.com/unhealthy"]  # and what self-healing does
        assert taint["value"] == "OverTemp"
        admin.create(claim("burn-in", selector=minor_is(3), tolerate_taints=True), "-n", namespace)
        claims = [{"name": "gpu", "resourceClaimName": "burn-in"}]
        run(admin, namespace, pod("burn-in", [container("main", [{"name": "gpu"}])], claims), driver, timeout=90)
        assert told(admin, namespace, "burn-in", "main") == {3}
        assert taints(), "the chip stays tainted for everyone else"
    finally:
        driver.set_chips(CHIPS)
        until(lambda: not taints(), 60, "gpu-3 untainted once it cools", [driver.log])


# ------------------------------------------------------------------ several containers


def test_iluvatar_gpu_in_a_sidecar_and_the_main_container_each_see_their_own_board(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver, extended_class: Obj
) -> None:
    """`iluvatar.com/gpu: 1` in a sidecar (a restartable init container) and in the main container, served through
    DRA: the scheduler's claim has a request per container (status.extendedResourceClaimStatus.requestMappings),
    and each container sees its own board's two chips only (it used to be told all four)."""
    sidecar = {**container("sidecar", gpus=1), "restartPolicy": "Always"}
    current = run(admin, namespace, pod("extended", [container("main", gpus=1)], init=[sidecar]), driver)
    status = current["status"]["extendedResourceClaimStatus"]
    by_request = {m["containerName"]: m["requestName"] for m in status["requestMappings"]}
    name = status["resourceClaimName"]
    for each in ("sidecar", "main"):
        assert told(admin, namespace, "extended", each) == minors_of(admin, namespace, name, by_request[each])
    assert told(admin, namespace, "extended", "sidecar").isdisjoint(told(admin, namespace, "extended", "main"))


IMPLICIT = f"deviceclass.resource.kubernetes.io/{DRIVER}"  # the extended resource every DeviceClass gives


@pytest.mark.parametrize(
    ("resource", "sidecar"),
    [("iluvatar.com/gpu", False), (IMPLICIT, False), ("iluvatar.com/gpu", True)],
    ids=["explicit", "implicit", "with-a-sidecar"],
)
def test_an_init_container_reusing_the_later_containers_gpus_sees_them_all_and_each_of_those_its_own(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver, extended_class: Obj, resource: str, sidecar: bool
) -> None:
    """Upstream's extended-resource pods with an init container of 2 and two containers of 1 after it (the first a
    sidecar, or both regular), explicitly `iluvatar.com/gpu` or the class's implicit name: the scheduler's claim
    has a request per later container and the init container reuses both (it runs before them). Each container
    sees exactly its chips: the init container all of them (it used to be told the second container's only), each
    later container its own (a board through `iluvatar.com/gpu`, a board or a chip through the implicit name)."""
    first = container("first", gpus=1, resource=resource)
    init = [container("init", gpus=2, resource=resource, stays=False)]
    if sidecar:
        init.append({**first, "restartPolicy": "Always"})
    later = [container("second", gpus=1, resource=resource)]
    name = "reused-sidecar" if sidecar else "reused"
    current = run(admin, namespace, pod(name, later if sidecar else [first, *later], init=init), driver)
    status = current["status"]["extendedResourceClaimStatus"]
    mapped: dict[str, set[str]] = {}
    for mapping in status["requestMappings"]:
        mapped.setdefault(mapping["containerName"], set()).add(mapping["requestName"])
    assert mapped["init"] == mapped["first"] | mapped["second"] and len(mapped["init"]) == 2, mapped
    claim_name = status["resourceClaimName"]
    later_minors = []
    for each in ("first", "second"):
        (request,) = mapped[each]
        later_minors.append(told(admin, namespace, name, each))
        assert later_minors[-1] == minors_of(admin, namespace, claim_name, request)
    assert later_minors[0].isdisjoint(later_minors[1])
    assert told(admin, namespace, name, "init") == minors_of(admin, namespace, claim_name) == set.union(*later_minors)


@pytest.mark.parametrize("attempt", [1, 2])
def test_claims_made_on_their_own_beside_the_pods_own_each_container_sees_its_chips(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver, attempt: int
) -> None:
    """Upstream's 'must map configs and devices to the right containers' on chips: a claim made on its own in both
    containers, a claim from the pod's template in the first, and one request of a two-request claim made on its
    own in the second. Each sees exactly its chips (one used to be told chip 1 while holding 0 and 1, the other
    chips 2 and 3 while holding 0 and 3)."""
    admin.create([claim("all"), with_requests(claim("c1"), ["req0", "req1"]), template("c0", ["gpu"])], "-n", namespace)
    claims = [
        {"name": "all", "resourceClaimName": "all"},
        {"name": "c0", "resourceClaimTemplateName": "c0"},
        {"name": "c1", "resourceClaimName": "c1"},
    ]
    containers = [
        container("container0", [{"name": "all"}, {"name": "c0"}]),
        container("container1", [{"name": "all"}, {"name": "c1", "request": "req1"}]),
    ]
    current = run(admin, namespace, pod("mixed", containers, claims), driver)
    shared, own = minors_of(admin, namespace, "all"), minors_of(admin, namespace, generated(current, "c0"))
    assert told(admin, namespace, "mixed", "container0") == shared | own
    assert told(admin, namespace, "mixed", "container1") == shared | minors_of(admin, namespace, "c1", "req1")


@pytest.mark.parametrize("attempt", [1, 2])
def test_several_requests_of_a_claim_referenced_by_different_containers(
    cluster: Cluster, admin: Kubectl, namespace: str, driver: Driver, attempt: int
) -> None:
    """A claim of the pod's template with two requests: one container references both, the other only the second
    beside a claim made on its own. Each sees exactly its chips."""
    admin.create([template("pair", ["r0", "r1"]), claim("z")], "-n", namespace)
    claims = [{"name": "pair", "resourceClaimTemplateName": "pair"}, {"name": "z", "resourceClaimName": "z"}]
    containers = [
        container("both", [{"name": "pair", "request": "r0"}, {"name": "pair", "request": "r1"}]),
        container("one", [{"name": "pair", "request": "r1"}, {"name": "z"}]),
    ]
    current = run(admin, namespace, pod("requests", containers, claims), driver)
    made = generated(current, "pair")
    assert told(admin, namespace, "requests", "both") == minors_of(admin, namespace, made)
    second = minors_of(admin, namespace, made, "r1") | minors_of(admin, namespace, "z")
    assert told(admin, namespace, "requests", "one") == second and len(second) == 2
