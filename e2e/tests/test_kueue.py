"""What a real Kueue charges each GPU shape, with the configuration docs/quota.md documents, on the real API server,
scheduler and kubelet with our DRA driver.

Kueue v0.19.2 runs as a host process (harness/kueue.py), started once for the file. The driver runs as in
test_dra_scheduler.py, over the node's 2 x BI-V150, and is restarted once for each node configuration: boards whole
(`iluvatar.com/gpu` is a board), split (`--splitboard true`: it is a chip), shared (`--replicas 4`), and a BI-V150
beside an MR-V50 (a single-chip board; a board claim that may get either is charged the larger). For each,
every shape the configuration offers is submitted at once: a Job (created suspended, with the queue label: no
webhook is registered) against a ClusterQueue whose nominal quota is exactly the shape's documented charge, and the
same Job against a ClusterQueue one unit smaller. The first is admitted, its Workload's
`status.admission.podSetAssignments[].resourceUsage` is the charge, and its pod runs with its devices (the Job
completes); the second stays pending, its Workload's QuotaReserved condition naming the resource. The shapes Kueue
cannot charge (a claim by name, `firstAvailable`, admin access, a chip on a shared node) are refused with the message
the user sees; each message is written to kueue-messages.txt in the run's log folder, for the docs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness.cluster import Cluster
from harness.dra import CHIPS, DRIVER, Driver, boards_yaml, driver_slices, slice_devices
from harness.kube import Kubectl, Obj
from harness.kueue import (
    BOARD_CLASS,
    CHIP_CLASS,
    FLAVOR_LABELS,
    GPU,
    SHARE_CLASS,
    SHARES,
    Kueue,
    cluster_queue,
    condition,
    local_queue,
    resource_flavor,
    resource_usage,
    suspended_job,
    workload_of,
)
from harness.kueue import CHIPS as CHIP_QUOTA
from harness.nfd import NfdLocalSource
from harness.pods import busybox_pod
from harness.waits import until

ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
ROOMY = 8  # the quota of a ClusterQueue for a refused shape: its refusal is not about quota
MESSAGES_FILE = "kueue-messages.txt"
CONFIG_LABEL = "ix-e2e/node-config"  # on each ClusterQueue: the node configuration whose batch made it


def request(
    name: str, device_class: str, count: int = 1, shares: int | None = None, selector: str | None = None
) -> Obj:
    """One ExactCount request of a ResourceClaim's devices, with a capacity request of shares, narrowed by a CEL
    selector."""
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if shares is not None:
        exactly["capacity"] = {"requests": {"shares": str(shares)}}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


@dataclass(frozen=True)
class Shape:
    """What a Job's pod asks for, and what docs/quota.md says Kueue charges for it (charge units of resource)."""

    name: str
    resource: str
    charge: int
    requests: tuple[Obj, ...] = ()  # its ResourceClaimTemplate's requests (none: no claim)
    constraints: tuple[Obj, ...] = ()
    gpus: int = 0  # the container's iluvatar.com/gpu, served through DRA (dra.extendedResourceName)

    def template(self) -> Obj | None:
        if not self.requests:
            return None
        devices: Obj = {"requests": list(self.requests)}
        if self.constraints:
            devices["constraints"] = list(self.constraints)
        spec = {"spec": {"devices": devices}}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": self.name},
            "spec": spec,
        }

    def pod_spec(self) -> Obj:
        """A pod that exits at once, with the shape's claim (from its template) or iluvatar.com/gpu."""
        if self.requests:
            claims = [{"name": "gpu", "resourceClaimTemplateName": self.name}]
            return busybox_pod("job", "true", claims=claims)["spec"]
        spec = busybox_pod("job", "true")["spec"]
        amount = str(self.gpus)
        spec["containers"][0]["resources"] = {"requests": {GPU: amount}, "limits": {GPU: amount}}
        return spec


CHIP = Shape("chip", CHIP_QUOTA, 1, (request("gpu", CHIP_CLASS),))
BOARD = Shape("board", CHIP_QUOTA, 2, (request("gpu", BOARD_CLASS),))
SAME_BOARD = {"requests": ["gpu"], "matchAttribute": f"{DRIVER}/boardUUID"}
BOARD_AS_CHIPS = Shape("board-as-two-chips", CHIP_QUOTA, 2, (request("gpu", CHIP_CLASS, count=2),), (SAME_BOARD,))
SHARE = Shape("share", SHARES, 1, (request("gpu", SHARE_CLASS),))
TWO_SHARES = Shape("two-shares", SHARES, 2, (request("gpu", SHARE_CLASS, shares=2),))
TWO_SHARE_REQUESTS = Shape("two-share-requests", SHARES, 2, (request("a", SHARE_CLASS), request("b", SHARE_CLASS)))
UNITS = Shape("gpu-units", GPU, 2, gpus=2)
# On a node of a BI-V150 and an MR-V50, a board claim may get either: Kueue charges the largest, 2; narrowed to the
# MR-V50, a single-chip board (its chip is the whole board), 1.
ANY_BOARD = Shape("any-board", CHIP_QUOTA, 2, BOARD.requests)
MR_V50 = f'device.attributes["{DRIVER}"].productName.endsWith("MR-V50")'
SINGLE_CHIP_BOARD = Shape("single-chip-board", CHIP_QUOTA, 1, (request("gpu", BOARD_CLASS, selector=MR_V50),))


@dataclass(frozen=True)
class Refused:
    """A shape Kueue refuses, and the stable part of the message it gives."""

    shape: Shape
    says: str
    by_name: bool = False  # the pod names a ResourceClaim made beforehand instead of a template


def first_available() -> Obj:
    return {"name": "gpu", "firstAvailable": [{"name": "chip", "deviceClassName": CHIP_CLASS}]}


def admin_access() -> Obj:
    chip = request("gpu", CHIP_CLASS)
    chip["exactly"]["adminAccess"] = True
    return chip


REFUSED_ANYWHERE = (
    Refused(
        Shape("claim-by-name", CHIP_QUOTA, 1, (request("gpu", CHIP_CLASS),)),
        "does not support use of resource claims",
        by_name=True,
    ),
    Refused(
        Shape("first-available", CHIP_QUOTA, 1, (first_available(),)),
        "FirstAvailable device selection is not supported",
    ),
    Refused(Shape("admin-access", CHIP_QUOTA, 1, (admin_access(),)), "AdminAccess is not supported"),
)
# A shared chip consumes no counter (it may be allocated many times): Kueue finds no `chips` to charge.
CHIP_ON_SHARED_NODE = Refused(
    Shape("chip-on-shared-node", CHIP_QUOTA, 1, CHIP.requests), 'no consumesCounters entry for counter "chips"'
)


@dataclass(frozen=True)
class NodeConfig:
    """A configuration of the node's ix-config (the driver's flags), its devices and the shapes tried on it."""

    name: str
    flags: tuple[str, ...]
    devices: tuple[str, ...]
    shapes: tuple[Shape, ...]
    refused: tuple[Refused, ...] = field(default=())
    devices_file: str | None = None  # the simulated boards (None: the node's 2 x BI-V150)


CHIP_NAMES = tuple(f"gpu-{chip.minor}" for chip in CHIPS)
CHIPS_AND_BOARDS = tuple(sorted((*CHIP_NAMES, "board-0", "board-2")))
EXCLUSIVE_SHAPES = (CHIP, BOARD, BOARD_AS_CHIPS, UNITS)
CONFIGS = (
    NodeConfig("unsplit", (), CHIPS_AND_BOARDS, EXCLUSIVE_SHAPES, REFUSED_ANYWHERE),
    NodeConfig("split", ("--splitboard", "true"), CHIPS_AND_BOARDS, EXCLUSIVE_SHAPES),
    NodeConfig(
        "mixed",
        (),
        ("board-0", "gpu-0", "gpu-1", "gpu-2"),
        (ANY_BOARD, SINGLE_CHIP_BOARD),
        devices_file=boards_yaml([{"product": "BI-V150"}, {"product": "MR-V50"}]),
    ),
    NodeConfig(
        "shared",
        ("--splitboard", "true", "--replicas", "4"),
        tuple(sorted(CHIP_NAMES)),
        (SHARE, TWO_SHARES, TWO_SHARE_REQUESTS, UNITS),
        (CHIP_ON_SHARED_NODE,),
    ),
)
BY_NAME = {config.name: config for config in CONFIGS}


@pytest.fixture(scope="module")
def kueue(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    """Kueue, ready, with the one ResourceFlavor the ClusterQueues use; stopped after the file."""
    running = Kueue(cluster, tmp_path_factory.mktemp("kueue")).start()
    try:
        cluster.admin.apply(resource_flavor())
        yield running
    finally:
        try:
            cluster.admin.delete("resourceflavor.kueue.x-k8s.io", resource_flavor()["metadata"]["name"])
        finally:
            running.stop()


@pytest.fixture(scope="module")
def node_labels(cluster: Cluster, driver: Driver) -> Iterator[NfdLocalSource]:
    """The driver's node labels on the Node (NFD's local source, modelled), which the flavor's nodeLabels name."""
    source = NfdLocalSource(cluster.admin, cluster.node_name, driver.workdir / "features.d").start()
    try:
        yield source
    finally:
        source.stop()


def has_flavor_labels(admin: Kubectl, node: str) -> bool:
    labels = admin.get("node", node)["metadata"].get("labels") or {}
    return all(labels.get(name) == value for name, value in FLAVOR_LABELS.items())


@dataclass(frozen=True)
class Batch:
    """The Jobs of one node configuration, submitted: in namespace, each shape's `<shape>-fits` and `<shape>-over`
    and each refused shape's `<shape>`, each with a LocalQueue of its name and a ClusterQueue of its own."""

    config: NodeConfig
    namespace: str
    admin: Kubectl
    logs: tuple[Path, ...]


def queue_objects(config: NodeConfig, namespace: str, job: str, quotas: dict[str, int], pod_spec: Obj) -> list[Obj]:
    """A ClusterQueue with quotas, its LocalQueue and a Job for it, all named after job."""
    queue = cluster_queue(f"{config.name}-{job}", quotas)
    queue["metadata"]["labels"] = {CONFIG_LABEL: config.name}
    return [queue, local_queue(job, namespace, queue["metadata"]["name"]), suspended_job(job, job, pod_spec)]


def batch_objects(config: NodeConfig, namespace: str) -> list[Obj]:
    """Every object of config's batch, in the order they are created."""
    objects: list[Obj] = []
    for shape in config.shapes:
        template = shape.template()
        objects += [template] if template else []
        objects += queue_objects(
            config, namespace, f"{shape.name}-fits", {shape.resource: shape.charge}, shape.pod_spec()
        )
        objects += queue_objects(
            config, namespace, f"{shape.name}-over", {shape.resource: shape.charge - 1}, shape.pod_spec()
        )
    for refused in config.refused:
        shape = refused.shape
        template = shape.template()
        assert template is not None
        spec = shape.pod_spec()
        if refused.by_name:
            template["kind"] = "ResourceClaim"
            template["spec"] = template["spec"]["spec"]
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": shape.name}]
        objects += [template, *queue_objects(config, namespace, shape.name, {shape.resource: ROOMY}, spec)]
    return objects


@pytest.fixture(scope="module")
def batch(
    request: pytest.FixtureRequest,
    kueue: Kueue,
    driver: Driver,
    node_labels: NfdLocalSource,
    dra_objects: list[Obj],
    extended_class: Obj,
) -> Iterator[Batch]:
    """The driver in the configuration named by the parameter, its node labelled for the flavor, and its batch
    submitted; its namespace and ClusterQueues deleted after (while Kueue runs, which releases them)."""
    config = BY_NAME[request.param]
    admin = driver.cluster.admin
    driver.configure(config.devices_file, config.flags)
    until(lambda: tuple(sorted(slice_devices(driver_slices(admin)))) == config.devices, 30, f"the {config.name} pool")
    until(lambda: has_flavor_labels(admin, driver.cluster.node_name), 30, "the node's labels", [driver.log])
    namespace = f"kueue-{config.name}"
    admin("create", "namespace", namespace)
    admin("label", "namespace", namespace, f"{ADMIN_ACCESS_LABEL}=true")
    objects = batch_objects(config, namespace)
    try:
        admin.create(objects, "-n", namespace)
        yield Batch(config, namespace, admin, (kueue.log, driver.log, *driver.cluster.control_plane_logs()))
    finally:
        admin("delete", "namespace", namespace, "--wait=true", "--timeout=120s", timeout=150)
        queues = ["delete", "clusterqueues.kueue.x-k8s.io", "-l", f"{CONFIG_LABEL}={config.name}", "--wait=true"]
        admin(*queues, "--timeout=60s", timeout=90)


def configs(with_refused: bool = False) -> list[object]:
    """The node configurations as parameters of `batch` (with_refused: those with shapes Kueue refuses)."""
    return [pytest.param(c.name, id=c.name) for c in CONFIGS if c.refused or not with_refused]


def wait_workload(batch: Batch, job: str, what: str, check: Callable[[Obj], bool]) -> Obj:
    """The Job's Workload once check(workload) holds."""

    def look() -> Obj | None:
        workload = workload_of(batch.admin, batch.namespace, job)
        return workload if workload is not None and check(workload) else None

    return until(look, 90, f"{batch.namespace}/{job}: {what}", batch.logs)


def quota_reserved(workload: Obj) -> bool:
    return (condition(workload, "QuotaReserved") or {}).get("status") == "True"


def not_reserved_saying(text: str) -> Callable[[Obj], bool]:
    """The Workload's QuotaReserved is False with a message that says text."""

    def check(workload: Obj) -> bool:
        found = condition(workload, "QuotaReserved") or {}
        return found.get("status") == "False" and text in found.get("message", "")

    return check


def job_outcome(admin: Kubectl, namespace: str, job: str) -> str | None:
    """Complete or Failed once the Job has finished, None before."""
    status = admin.get("job", job, namespace)
    return next(
        (kind for kind in ("Complete", "Failed") if (condition(status, kind) or {}).get("status") == "True"), None
    )


def record(log_dir: Path, case: str, workload: Obj) -> None:
    """The Workload's QuotaReserved reason and message, written to MESSAGES_FILE for the docs."""
    found = condition(workload, "QuotaReserved") or {}
    with (log_dir / MESSAGES_FILE).open("a") as file:
        file.write(f"{case}\treason={found.get('reason')}\t{found.get('message', '')}\n")


@pytest.mark.parametrize("batch", configs(), indirect=True)
def test_each_job_its_quota_exactly_fits_is_admitted_charged_as_documented_and_runs(batch: Batch) -> None:
    shapes = batch.config.shapes
    charged = {
        s.name: resource_usage(wait_workload(batch, f"{s.name}-fits", "admitted", quota_reserved)) for s in shapes
    }
    assert charged == {shape.name: {shape.resource: str(shape.charge)} for shape in shapes}
    outcomes = {}
    for shape in shapes:
        job = f"{shape.name}-fits"
        outcomes[shape.name] = until(
            lambda job=job: job_outcome(batch.admin, batch.namespace, job), 120, f"job {job} finished", batch.logs
        )
    assert outcomes == dict.fromkeys(outcomes, "Complete")


@pytest.mark.parametrize("batch", configs(), indirect=True)
def test_each_job_one_unit_over_its_quota_stays_pending_naming_the_resource(batch: Batch, log_dir: Path) -> None:
    for shape in batch.config.shapes:
        job = f"{shape.name}-over"
        says = f"insufficient quota for {shape.resource}"
        workload = wait_workload(batch, job, f"pending: {says}", not_reserved_saying(says))
        record(log_dir, f"{batch.config.name} {job}", workload)
        assert workload["status"].get("admission") is None
        assert batch.admin.get("job", job, batch.namespace)["spec"]["suspend"] is True


@pytest.mark.parametrize("batch", configs(with_refused=True), indirect=True)
def test_kueue_refuses_the_shapes_it_cannot_charge_saying_why(batch: Batch, log_dir: Path) -> None:
    for refused in batch.config.refused:
        job = refused.shape.name
        workload = wait_workload(batch, job, f"refused: {refused.says}", not_reserved_saying(refused.says))
        record(log_dir, f"{batch.config.name} {job}", workload)
        assert workload["status"].get("admission") is None
        assert batch.admin.get("job", job, batch.namespace)["spec"]["suspend"] is True
