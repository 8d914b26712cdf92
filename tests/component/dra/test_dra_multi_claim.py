"""Each container is told exactly the chips it holds, whatever order the runtime applies its claims' CDI specs in.

The driver over simulated chips, the kubelet and API server stand-ins (the pods and claims as the API server keeps
them, reservedFor included; the claims of a pod prepared in one call as the kubelet asks). What each container gets
is built here as the kubelet 1.37 builds it (GetResources: claim by claim in no fixed order, each claim's requests in
the container's order, the devices answered for each request in the driver's order; containerd drops a repeated
ID), and applied in every order of its claims with the real CDI library where the end-to-end build has it
(`cdi-validate --inject`), with a model of it (a spec's own edits at its first device, then each device's, the last
value of a variable winning) otherwise.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.cdi_library import cdi_validate, inject
from helpers.dra_support import NODE, DraNode, store_pod
from helpers.host_tools import missing

from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.dra.metadata import cdi_spec_file as metadata_spec_file
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.apiserver import ApiServerStandIn

VISIBLE = ("IX_VISIBLE_DEVICES", "ILUVATAR_COREX_VISIBLE_DEVICES")
REPLICAS = ("IX_REPLICA_DEVICES", "ILUVATAR_COREX_REPLICA_DEVICES")
DEVICE_MAJOR = 508  # any character device major: the library only reads the numbers
Answers = dict[str, list[tuple[list[str], list[str]]]]  # claim name -> (request names, CDI IDs) of each device


@pytest.fixture
def cdi_library(node: DraNode) -> Path | None:
    """cdi-validate, with the node's device nodes made (the CDI library reads their numbers); None without it,
    or where device nodes cannot be made (not root)."""
    binary, _ = cdi_validate()
    return binary if binary is not None and make_device_nodes(node.root / "dev") else None


def make_device_nodes(dev: Path) -> bool:
    """/dev/iluvatar0-3 under dev, as character devices; False where this user cannot make them."""
    dev.mkdir(parents=True, exist_ok=True)
    try:
        for minor in range(4):
            path = dev / f"iluvatar{minor}"
            if not path.exists():
                os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(DEVICE_MAJOR, minor))
    except PermissionError:
        return False
    return True


def uuids(node: DraNode) -> dict[str, str]:
    return {name: d["attributes"]["uuid"]["string"] for name, d in node.slice_devices().items() if name[:4] == "gpu-"}


async def prepared(kubelet: Any, claims: Sequence[tuple[str, str, str]], answers: Answers | None = None) -> Answers:
    """Prepare the claims in one call, as the kubelet does for a pod; every claim's answer so far, by name."""
    response = await kubelet.prepare(claims)
    answers = {} if answers is None else answers
    for _, name, uid in claims:
        answer = response.claims[uid]
        assert answer.error == "", answer.error
        answers[name] = [(list(d.request_names), list(d.cdi_device_ids)) for d in answer.devices]
    return answers


def kubelet_blocks(pod: Mapping[str, Any], container: str, answers: Answers) -> list[list[str]]:
    """The CDI IDs the kubelet hands the container, claim by claim (pkg/kubelet/cm/dra/manager.go, GetResources)."""
    spec, status = pod["spec"], pod.get("status", {})
    every = [*spec.get("initContainers", []), *spec["containers"]]
    (found,) = [c for c in every if c["name"] == container]
    references: dict[str, list[str]] = {}
    for reference in found.get("resources", {}).get("claims", []):
        references.setdefault(reference["name"], []).append(reference.get("request", ""))
    generated = {s["name"]: s["resourceClaimName"] for s in status.get("resourceClaimStatuses", [])}
    requests: dict[str, list[str]] = {}
    for entry in spec.get("resourceClaims", []):
        if entry["name"] in references:
            name = entry.get("resourceClaimName") or generated[entry["name"]]
            requests.setdefault(name, []).extend(references[entry["name"]])
    extended = status.get("extendedResourceClaimStatus")
    if extended:
        asked = {r for r, q in found.get("resources", {}).get("requests", {}).items() if q != "0" and "/" in r}
        for mapping in extended["requestMappings"]:
            if mapping["containerName"] == container and mapping["resourceName"] in asked:
                requests.setdefault(extended["resourceClaimName"], []).append(mapping["requestName"])
    blocks = []
    for name, wanted in requests.items():
        devices = answers.get(name, [])
        blocks.append([i for r in wanted for names, ids in devices if not r or not names or r in names for i in ids])
    return blocks


def spec_devices(node: DraNode) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every CDI device of the node's claim and device metadata specs: (spec file, device), by fully qualified
    name."""
    found = {}
    for path in [*node.cdi_dir.glob(cdi_spec_file("*")), *node.cdi_dir.glob(metadata_spec_file("*", "*"))]:
        spec = yaml.safe_load(path.read_text())
        for device in spec["devices"]:
            found[f"{spec['kind']}={device['name']}"] = (path.name, device)
    return found


def cdi_model(node: DraNode, devices: Sequence[str]) -> dict[str, str]:
    """What the CDI library gives a container of these devices, in this order: a spec's own edits at its first
    device, then each device's; a variable set again keeps its last value."""
    known, specs = spec_devices(node), {}
    env: dict[str, str] = {}
    for device in devices:
        path, entry = known[device]
        if path not in specs:
            specs[path] = yaml.safe_load((node.cdi_dir / path).read_text())
            env.update(item.partition("=")[::2] for item in specs[path].get("containerEdits", {}).get("env", []))
        env.update(item.partition("=")[::2] for item in entry["containerEdits"].get("env", []))
    return env


def told_in_every_order(node: DraNode, library: Path | None, blocks: list[list[str]]) -> list[tuple[str, dict]]:
    """(the order, the env) a container gets in every order of its claims (containerd keeps the first of a
    repeated ID), through the real CDI library when it is here."""
    told = []
    for order in itertools.permutations(blocks):
        devices = list(dict.fromkeys(i for block in order for i in block))
        env = inject(library, node.cdi_dir, devices)[0] if library is not None else cdi_model(node, devices)
        told.append((",".join(devices), env))
    return told


def assert_told(env: Mapping[str, str], visible: set[str], replicas: set[str], where: str) -> None:
    for variable, expected in [*((v, visible) for v in VISIBLE), *((r, replicas) for r in REPLICAS)]:
        listed = env.get(variable, "").split(",")
        assert len(listed) == len(set(listed)) and set(listed) == expected, f"{where}: {variable}={env.get(variable)}"


def check(
    node: DraNode,
    library: Path | None,
    pod: Mapping[str, Any],
    answers: Answers,
    container: str,
    visible: set[str],
    replicas: set[str] | None = None,
) -> int:
    """The container is told visible (and replicas: the chips' UUIDs when not given) in every order of its claims;
    the number of orders."""
    orders = told_in_every_order(node, library, kubelet_blocks(pod, container, answers))
    for order, env in orders:
        assert_told(env, visible, visible if replicas is None else replicas, f"{container} given {order}")
    return len(orders)


async def started(node: DraNode, **overrides: Any) -> Any:
    """A kubelet stand-in registered with a driver started on the node (overrides: its options)."""
    driver = await node.start(**overrides)
    await node.wait_slice(lambda devices: len(devices) == (4 if "config" in overrides else 6))
    return await node.kubelet(driver)


# ------------------------------------------------------------------ the pod's own claims


async def test_two_claims_in_one_container_are_both_told_and_a_sidecar_sees_its_own(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """A board claim and a chip claim in one container: all three chips in every variable, in both orders; a
    second container of the pod with a claim of its own is told only its chip."""
    kubelet = await started(node)
    pod = ("two", str(uuid.uuid4()))
    claims = [node.claim(name, [device], pod=pod) for name, device in (("board", "board-0"), ("chip", "gpu-2"))]
    claims.append(node.claim("side", ["gpu-3"], pod=pod))
    stored = store_pod(api, *pod, {"main": ["board", "chip"], "sidecar": ["side"]}, templates=["board", "chip", "side"])
    answers = await prepared(kubelet, claims)
    chip = uuids(node)
    held = {chip["gpu-0"], chip["gpu-1"], chip["gpu-2"]}
    devices = {chip["gpu-0"], chip["gpu-2"]}  # a board held whole is one replica ID, as the device plugin names it
    assert check(node, cdi_library, stored, answers, "main", held, devices) == 2
    assert check(node, cdi_library, stored, answers, "sidecar", {chip["gpu-3"]}) == 1
    await kubelet.close()


async def test_three_shared_claims_in_one_container_are_all_told_with_their_replicas(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """Two shares of one chip and two shares of another, in three claims of one container: both chips, once
    each, and every share's replica ID, in all six orders."""
    kubelet = await started(node, config=Config(splitboard=True, replicas=4))
    pod = ("three", str(uuid.uuid4()))
    claims = [
        node.claim("a", ["gpu-0"], shares=1, pod=pod),
        node.claim("b", ["gpu-0"], shares=1, pod=pod),
        node.claim("c", ["gpu-1"], shares=2, pod=pod),
    ]
    stored = store_pod(api, *pod, {"main": ["a", "b", "c"]}, templates=["a", "b", "c"])
    answers = await prepared(kubelet, claims)
    chip = uuids(node)
    replicas = {f"{chip['gpu-0']}::0", f"{chip['gpu-0']}::1", f"{chip['gpu-1']}::0", f"{chip['gpu-1']}::1"}
    assert check(node, cdi_library, stored, answers, "main", {chip["gpu-0"], chip["gpu-1"]}, replicas) == 6
    await kubelet.close()


async def test_three_claims_with_admin_access_and_a_request_of_its_own(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """A chip, a monitoring claim (adminAccess) on a chip another pod holds, and one request of a two-chip claim:
    the container is told those three chips in all six orders, and the other request's chip goes to the other
    container alone."""
    kubelet = await started(node)
    holder = node.claim("holder", ["gpu-3"])
    assert (await kubelet.prepare([holder])).claims[holder[2]].error == ""
    pod = ("three", str(uuid.uuid4()))
    claims = [
        node.claim("chip", ["gpu-0"], pod=pod),
        node.claim("monitor", ["gpu-3"], admin_access=True, pod=pod),
        node.claim("pair", ["gpu-1"], request="first", pod=pod),
    ]
    api.put("resourceclaims", with_request(api.get("resourceclaims", "pair", "default"), "second", "gpu-2"))
    stored = store_pod(
        api,
        *pod,
        {"main": ["chip", "monitor", "pair/first"], "other": ["pair/second"]},
        templates=["chip", "monitor", "pair"],
    )
    answers = await prepared(kubelet, claims)
    chip = uuids(node)
    held = {chip["gpu-0"], chip["gpu-3"], chip["gpu-1"]}
    assert check(node, cdi_library, stored, answers, "main", held) == 6
    assert check(node, cdi_library, stored, answers, "other", {chip["gpu-2"]}) == 1
    await kubelet.close()


def with_request(claim: dict[str, Any], request: str, device: str, subrequest: str = "") -> dict[str, Any]:
    """The claim with one more request, allocated device (as `request/subrequest` when given)."""
    results = claim["status"]["allocation"]["devices"]["results"]
    allocated = f"{request}/{subrequest}" if subrequest else request
    results.append({**results[0], "request": allocated, "device": device})
    claim["spec"]["devices"]["requests"].append({"name": request, "exactly": {"deviceClassName": "gpu.iluvatar.com"}})
    return claim


async def test_several_requests_of_a_claim_go_to_the_containers_that_reference_them(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """One container references both requests of a claim, another one of them beside a claim of its own: each is
    told exactly its chips in every order (the shared chip's device sets nothing; the spec's own edits tell the
    second container)."""
    kubelet = await started(node)
    pod = ("requests", str(uuid.uuid4()))
    claims = [node.claim("pair", ["gpu-0"], request="r0", pod=pod), node.claim("own", ["gpu-3"], pod=pod)]
    api.put("resourceclaims", with_request(api.get("resourceclaims", "pair", "default"), "r1", "gpu-1"))
    stored = store_pod(api, *pod, {"both": ["pair/r0", "pair/r1"], "one": ["pair/r1", "own"]}, ["pair", "own"])
    answers = await prepared(kubelet, claims)
    chip = uuids(node)
    assert check(node, cdi_library, stored, answers, "both", {chip["gpu-0"], chip["gpu-1"]}) == 1
    assert check(node, cdi_library, stored, answers, "one", {chip["gpu-1"], chip["gpu-3"]}) == 2
    await kubelet.close()


async def test_a_subrequest_reaches_the_container_that_references_its_request(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """A prioritized list's choice (`request-1/sub-request-2`, two chips): the container referencing `request-1`
    gets both chips, and the other request's chip goes to the other container."""
    kubelet = await started(node)
    pod = ("pick", str(uuid.uuid4()))
    claims = [node.claim("pick", ["gpu-0", "gpu-1"], request="request-1/sub-request-2", pod=pod)]
    api.put("resourceclaims", with_request(api.get("resourceclaims", "pick", "default"), "other", "gpu-2"))
    stored = store_pod(api, *pod, {"main": ["pick/request-1"], "side": ["pick/other"]}, templates=["pick"])
    answers = await prepared(kubelet, claims)
    chip = uuids(node)
    assert check(node, cdi_library, stored, answers, "main", {chip["gpu-0"], chip["gpu-1"]}) == 1
    assert check(node, cdi_library, stored, answers, "side", {chip["gpu-2"]}) == 1
    await kubelet.close()


# ------------------------------------------------------------------ claims made on their own, the extended resource


async def test_a_claim_made_on_its_own_beside_the_pods_own_claims_in_two_containers(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Upstream's 'must map configs and devices to the right containers', on chips: a claim made on its own (chip
    0) in both containers, one with a claim of chip 1 made for the pod, the other with one request (chip 3) of
    a claim made on its own of chips 2 and 3. Each is told exactly its chips in every order, and the log says
    what a pod that starts using the shared claim later would be told."""
    kubelet = await started(node)
    pod = ("mixed", str(uuid.uuid4()))
    claims = [
        node.claim("all", ["gpu-0"], reserved_for=[pod]),
        node.claim("c0", ["gpu-1"], pod=pod),
        node.claim("c1", ["gpu-2"], request="req0", reserved_for=[pod]),
    ]
    api.put("resourceclaims", with_request(api.get("resourceclaims", "c1", "default"), "req1", "gpu-3"))
    shape = {"container0": ["all", "c0"], "container1": ["all", "c1/req1"]}
    stored = store_pod(api, *pod, shape, templates=["c0"])
    with caplog.at_level(logging.WARNING):
        answers = await prepared(kubelet, claims)
    chip = uuids(node)
    assert check(node, cdi_library, stored, answers, "container0", {chip["gpu-0"], chip["gpu-1"]}) == 2
    assert check(node, cdi_library, stored, answers, "container1", {chip["gpu-0"], chip["gpu-3"]}) == 2
    assert any("claim default/all" in r.getMessage() and "later" in r.getMessage() for r in caplog.records)
    assert not any(" holds " in r.getMessage() for r in caplog.records)
    await kubelet.close()


async def test_a_later_pod_of_a_shared_claim_is_told_its_chips_with_the_earlier_ones(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """A claim made on its own, prepared for a first pod that uses it alone; a second pod uses it alone too, with
    a claim of its own in another container: when the second pod's claim is prepared the shared claim's spec is
    worked out again for the containers of both pods, and every one is told exactly its chips."""
    kubelet = await started(node)
    first, second = ("first", str(uuid.uuid4())), ("second", str(uuid.uuid4()))
    shared = node.claim("shared", ["gpu-0"], reserved_for=[first])
    one = store_pod(api, *first, {"main": ["shared"]})
    answers = await prepared(kubelet, [shared])
    api.put("resourceclaims", reserved(api.get("resourceclaims", "shared", "default"), first, second))
    own = node.claim("own", ["gpu-1"], pod=second)
    two = store_pod(api, *second, {"main": ["shared"], "other": ["own"]}, templates=["own"])
    answers = await prepared(kubelet, [own], answers)  # the kubelet does not prepare the shared claim again
    chip = uuids(node)
    assert check(node, cdi_library, one, answers, "main", {chip["gpu-0"]}) == 1
    assert check(node, cdi_library, two, answers, "main", {chip["gpu-0"]}) == 1
    assert check(node, cdi_library, two, answers, "other", {chip["gpu-1"]}) == 1
    await kubelet.close()


def reserved(claim: dict[str, Any], *pods: tuple[str, str]) -> dict[str, Any]:
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": name, "uid": uid} for name, uid in pods]
    return claim


async def test_the_extended_resource_claim_tells_each_container_the_devices_mapped_to_it(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """`iluvatar.com/gpu: 1` in a sidecar (a restartable init container) and in the main container, served by DRA:
    the scheduler's claim holds a request per container (status.extendedResourceClaimStatus.requestMappings), and
    each container is told its own board's chips, not the other's."""
    kubelet = await started(node)
    pod = ("extended", str(uuid.uuid4()))
    ext = node.claim("extended-resources-x1", ["board-0"], request="container-0-request-0", pod=pod)
    api.put(
        "resourceclaims",
        with_request(api.get("resourceclaims", ext[1], "default"), "container-1-request-0", "board-2"),
    )
    limits = {"iluvatar.com/gpu": "1"}
    mappings = [
        {"containerName": name, "resourceName": "iluvatar.com/gpu", "requestName": f"container-{index}-request-0"}
        for index, name in enumerate(("sidecar", "main"))
    ]
    resources = {"requests": limits, "limits": limits}
    sidecar = {"name": "sidecar", "image": "busybox", "restartPolicy": "Always", "resources": resources}
    stored = api.put(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod[0], "namespace": "default", "uid": pod[1]},
            "spec": {
                "nodeName": NODE,
                "initContainers": [sidecar],
                "containers": [{"name": "main", "image": "busybox", "resources": resources}],
            },
            "status": {"extendedResourceClaimStatus": {"resourceClaimName": ext[1], "requestMappings": mappings}},
        },
    )
    answers = await prepared(kubelet, [ext])
    chip = uuids(node)
    board_0, board_2 = {chip["gpu-0"], chip["gpu-1"]}, {chip["gpu-2"], chip["gpu-3"]}
    assert check(node, cdi_library, stored, answers, "sidecar", board_0, {chip["gpu-0"]}) == 1
    assert check(node, cdi_library, stored, answers, "main", board_2, {chip["gpu-2"]}) == 1
    await kubelet.close()


async def test_an_init_container_reusing_the_later_containers_chips_is_told_both_and_each_of_them_its_own(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """Upstream's shape, `iluvatar.com/gpu` through DRA: an init container of 2 and two containers of 1 each. The
    scheduler's claim has a request per later container, and the init container reuses both (it runs before
    them). The driver answers a relay among the two devices' CDI IDs, each device's own ID still first (the kubelet
    names its health by it): the init container is told both chips, each later container its own, through the real
    CDI library, with the IDs the kubelet lists as containerd keeps them."""
    kubelet = await started(node)
    pod = ("reused", str(uuid.uuid4()))
    ext = node.claim("extended-resources-r1", ["gpu-0"], request="container-1-request-0", pod=pod)
    api.put(
        "resourceclaims", with_request(api.get("resourceclaims", ext[1], "default"), "container-2-request-0", "gpu-1")
    )
    gpu = "iluvatar.com/gpu"
    mapped = [("c1", "container-1-request-0"), ("c2", "container-2-request-0")]
    mapped += [("init", "container-1-request-0"), ("init", "container-2-request-0")]
    mappings = [{"containerName": c, "resourceName": gpu, "requestName": r} for c, r in mapped]

    def container(name: str, count: int) -> dict[str, Any]:
        asked = {gpu: str(count)}
        return {"name": name, "image": "busybox", "resources": {"requests": asked, "limits": asked}}

    stored = api.put(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod[0], "namespace": "default", "uid": pod[1]},
            "spec": {
                "nodeName": NODE,
                "initContainers": [container("init", 2)],
                "containers": [container("c1", 1), container("c2", 1)],
            },
            "status": {"extendedResourceClaimStatus": {"resourceClaimName": ext[1], "requestMappings": mappings}},
        },
    )
    answers = await prepared(kubelet, [ext])
    assert all(ids[0].endswith(device) for (_, ids), device in zip(answers[ext[1]], ("-gpu-0", "-gpu-1"), strict=True))
    chip = uuids(node)
    assert check(node, cdi_library, stored, answers, "init", {chip["gpu-0"], chip["gpu-1"]}) == 1
    assert check(node, cdi_library, stored, answers, "c1", {chip["gpu-0"]}) == 1
    assert check(node, cdi_library, stored, answers, "c2", {chip["gpu-1"]}) == 1
    await kubelet.close()


# ------------------------------------------------------------------ what cannot be known


async def test_a_pod_that_cannot_be_read_leaves_each_claim_naming_its_own_and_says_so(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet = await started(node)
    pod = ("slow", str(uuid.uuid4()))
    claims = [node.claim("a", ["gpu-0"], pod=pod), node.claim("b", ["gpu-1"], pod=pod)]
    store_pod(api, *pod, {"main": ["a", "b"]}, templates=["a", "b"])
    api.slow_down("GET", "/pods/slow", 5.0, times=5)  # past the driver's read deadline (1.5 s here)
    answers = await prepared(kubelet, claims)
    chip = uuids(node)
    for name, device in (("a", "gpu-0"), ("b", "gpu-1")):
        env = cdi_model(node, answers[name][0][1])
        assert_told(env, {chip[device]}, {chip[device]}, name)
    assert any("pod default/slow" in r.getMessage() and "not changed" in r.getMessage() for r in caplog.records)
    await kubelet.close()


def test_the_real_cdi_library_is_here_or_the_skip_says_why(tmp_path: Path) -> None:
    binary, reason = cdi_validate()
    if binary is None:
        missing(f"the CDI library's orders are not applied: {reason}")
    if not make_device_nodes(tmp_path):
        missing("the CDI library's orders are not applied: making device nodes needs root")


async def test_after_a_reboot_the_specs_written_again_still_tell_each_container(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    kubelet = await started(node)
    pod = ("two", str(uuid.uuid4()))
    claims = [node.claim("a", ["gpu-0"], pod=pod), node.claim("b", ["gpu-1"], pod=pod)]
    stored = store_pod(api, *pod, {"main": ["a", "b"]}, templates=["a", "b"])
    answers = await prepared(kubelet, claims)
    await kubelet.close()
    await node.stop_all()
    node.reboot()
    await node.start()
    chip = uuids(node)
    assert check(node, cdi_library, stored, answers, "main", {chip["gpu-0"], chip["gpu-1"]}) == 2
