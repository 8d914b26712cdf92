"""A container with several claims sees every chip it holds in every GPU variable, whatever order the runtime
applies their CDI specs in.

The driver over simulated chips, the kubelet and API server stand-ins (the pod and its claims as the API server
keeps them, the claims prepared in one call as the kubelet asks for a pod's). The specs it writes are applied in
every order with the real CDI library where the end-to-end build has it (`cdi-validate --inject`); what each
device of them sets is checked here in any case.
"""

from __future__ import annotations

import itertools
import os
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from cdi_library import cdi_validate, inject
from dra_support import DraNode, store_pod
from host_tools import missing

from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.apiserver import ApiServerStandIn

VISIBLE = ("IX_VISIBLE_DEVICES", "ILUVATAR_COREX_VISIBLE_DEVICES")
REPLICAS = ("IX_REPLICA_DEVICES", "ILUVATAR_COREX_REPLICA_DEVICES")
CDI_PREFIX = "gpu.iluvatar.com/claim="
DEVICE_MAJOR = 508  # any character device major: the library only reads the numbers


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
            os.mknod(dev / f"iluvatar{minor}", stat.S_IFCHR | 0o666, os.makedev(DEVICE_MAJOR, minor))
    except PermissionError:
        return False
    return True


def uuids(node: DraNode) -> dict[str, str]:
    return {name: d["attributes"]["uuid"]["string"] for name, d in node.slice_devices().items() if name[:4] == "gpu-"}


async def prepared_ids(node: DraNode, kubelet: Any, claims: list[tuple[str, str, str]]) -> dict[str, list[str]]:
    """Prepare the claims in one call, as the kubelet does for a pod; each claim's CDI IDs, by claim name."""
    response = await kubelet.prepare(claims)
    ids = {}
    for _, name, uid in claims:
        answer = response.claims[uid]
        assert answer.error == "", answer.error
        ids[name] = [cdi_id for device in answer.devices for cdi_id in device.cdi_device_ids]
    return ids


def device_env(node: DraNode, cdi_id: str) -> dict[str, str]:
    """What one CDI device of a claim spec sets in its own edits."""
    name = cdi_id.removeprefix(CDI_PREFIX)
    for path in node.cdi_dir.glob(cdi_spec_file("*")):
        for device in yaml.safe_load(path.read_text())["devices"]:
            if device["name"] == name:
                return dict(item.partition("=")[::2] for item in device["containerEdits"].get("env", []))
    raise AssertionError(f"no CDI device {name} in {node.cdi_dir}")


def assert_told(env: dict[str, str], visible: set[str], replicas: set[str], where: str) -> None:
    for variable, expected in [*((v, visible) for v in VISIBLE), *((r, replicas) for r in REPLICAS)]:
        listed = env.get(variable, "").split(",")
        assert len(listed) == len(set(listed)) and set(listed) == expected, f"{where}: {variable}={env.get(variable)}"


def check_container(
    node: DraNode, library: Path | None, cdi_ids: list[str], visible: set[str], replicas: set[str]
) -> int:
    """Every device of the container sets the container's whole holding, and the real CDI library gives the
    container all of it in every order of its devices; the number of orders applied (0: no library here)."""
    orders = list(itertools.permutations(cdi_ids)) if library is not None else []
    for order in orders:
        assert library is not None
        env, _ = inject(library, node.cdi_dir, order)
        assert_told(env, visible, replicas, f"a container given {', '.join(order)}")
    for cdi_id in cdi_ids:
        assert_told(device_env(node, cdi_id), visible, replicas, f"the edits of {cdi_id}")
    return len(orders)


async def test_two_claims_in_one_container_are_both_named_and_a_sidecar_sees_its_own(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """A board claim and a chip claim in one container: all three chips in every variable, in both orders; a
    second container of the pod with a claim of its own is told only its chip."""
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    pod = ("two", str(uuid.uuid4()))
    claims = [node.claim(name, [device], pod=pod) for name, device in (("board", "board-0"), ("chip", "gpu-2"))]
    claims.append(node.claim("side", ["gpu-3"], pod=pod))
    store_pod(api, *pod, {"main": ["board", "chip"], "sidecar": ["side"]}, templates=["board", "chip", "side"])
    ids = await prepared_ids(node, kubelet, claims)
    chip = uuids(node)
    held = {chip["gpu-0"], chip["gpu-1"], chip["gpu-2"]}
    devices = {chip["gpu-0"], chip["gpu-2"]}  # a board held whole is one replica ID, as the device plugin names it
    assert check_container(node, cdi_library, ids["board"] + ids["chip"], held, devices) in (0, 2)
    assert check_container(node, cdi_library, ids["side"], {chip["gpu-3"]}, {chip["gpu-3"]}) in (0, 1)
    await kubelet.close()


async def test_three_shared_claims_in_one_container_are_all_named_with_their_replicas(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """Two shares of one chip and two shares of another, in three claims of one container: both chips, once
    each, and every share's replica ID, in all six orders."""
    driver = await node.start(config=Config(splitboard=True, replicas=4))
    await node.wait_slice(lambda devices: sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
    kubelet = await node.kubelet(driver)
    pod = ("three", str(uuid.uuid4()))
    claims = [
        node.claim("a", ["gpu-0"], shares=1, pod=pod),
        node.claim("b", ["gpu-0"], shares=1, pod=pod),
        node.claim("c", ["gpu-1"], shares=2, pod=pod),
    ]
    store_pod(api, *pod, {"main": ["a", "b", "c"]}, templates=["a", "b", "c"])
    ids = await prepared_ids(node, kubelet, claims)
    chip = uuids(node)
    replicas = {f"{chip['gpu-0']}::0", f"{chip['gpu-0']}::1", f"{chip['gpu-1']}::0", f"{chip['gpu-1']}::1"}
    cdi_ids = ids["a"] + ids["b"] + ids["c"]
    assert check_container(node, cdi_library, cdi_ids, {chip["gpu-0"], chip["gpu-1"]}, replicas) in (0, 6)
    await kubelet.close()


async def test_three_claims_with_admin_access_and_a_request_of_its_own(
    node: DraNode, api: ApiServerStandIn, cdi_library: Path | None
) -> None:
    """A chip, a monitoring claim (adminAccess) on a chip another pod holds, and one request of a two-chip claim:
    the container is told those three chips in all six orders, and the other request's chip goes to the other
    container alone."""
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    holder = node.claim("holder", ["gpu-3"])
    assert (await kubelet.prepare([holder])).claims[holder[2]].error == ""
    pod = ("three", str(uuid.uuid4()))
    claims = [
        node.claim("chip", ["gpu-0"], pod=pod),
        node.claim("monitor", ["gpu-3"], admin_access=True, pod=pod),
        node.claim("pair", ["gpu-1"], request="first", pod=pod),
    ]
    api.put("resourceclaims", with_second_request(api.get("resourceclaims", "pair", "default"), "gpu-2"))
    store_pod(
        api,
        *pod,
        {"main": ["chip", "monitor", "pair/first"], "other": ["pair/second"]},
        templates=["chip", "monitor", "pair"],
    )
    ids = await prepared_ids(node, kubelet, claims)
    chip = uuids(node)
    first, second = ids["pair"]
    held = {chip["gpu-0"], chip["gpu-3"], chip["gpu-1"]}
    assert check_container(node, cdi_library, ids["chip"] + ids["monitor"] + [first], held, held) in (0, 6)
    assert check_container(node, cdi_library, [second], {chip["gpu-2"]}, {chip["gpu-2"]}) in (0, 1)
    await kubelet.close()


def with_second_request(claim: dict[str, Any], device: str) -> dict[str, Any]:
    """The claim with a second request, `second`, allocated device (the first keeps its own)."""
    results = claim["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "request": "second", "device": device})
    claim["spec"]["devices"]["requests"].append({"name": "second", "exactly": {"deviceClassName": "gpu.iluvatar.com"}})
    return claim


async def test_a_claim_of_its_own_sets_nothing_per_device(node: DraNode, api: ApiServerStandIn) -> None:
    """A ResourceClaim made on its own may be shared with pods not started yet: its devices name nothing of their
    own (its spec names its own chips, as before), while the pod's own claim in the same container names both."""
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    pod = ("mixed", str(uuid.uuid4()))
    claims = [node.claim("shared", ["gpu-0"]), node.claim("own", ["gpu-1"], pod=pod)]
    store_pod(api, *pod, {"main": ["shared", "own"]}, templates=["own"])
    ids = await prepared_ids(node, kubelet, claims)
    chip = uuids(node)
    assert device_env(node, ids["shared"][0]) == {}
    assert_told(device_env(node, ids["own"][0]), {chip["gpu-0"], chip["gpu-1"]}, {chip["gpu-0"], chip["gpu-1"]}, "own")
    await kubelet.close()


def test_the_real_cdi_library_is_here_or_the_skip_says_why(tmp_path: Path) -> None:
    binary, reason = cdi_validate()
    if binary is None:
        missing(f"the CDI library's orders are not applied: {reason}")
    if not make_device_nodes(tmp_path):
        missing("the CDI library's orders are not applied: making device nodes needs root")


async def test_a_pod_that_cannot_be_read_leaves_each_claim_naming_its_own_and_says_so(
    node: DraNode, api: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """The pod is gone when its claims are prepared. kube-controller-manager's garbage collector, as the stand-in's,
    deletes the claims of a pod that is gone (soon after, at a time of its own): this test is about the prepare
    that comes first, so the collector is off, and the worst case of its timing (a run just before the prepare)
    is made to happen."""
    api.garbage_collector = False
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    pod = ("gone", str(uuid.uuid4()))
    claims = [node.claim("a", ["gpu-0"], pod=pod), node.claim("b", ["gpu-1"], pod=pod)]
    api.collect_garbage()
    ids = await prepared_ids(node, kubelet, claims)
    assert device_env(node, ids["a"][0]) == device_env(node, ids["b"][0]) == {}
    assert any(
        "pod default/gone: no such Pod" in r.getMessage() and "several claims" in r.getMessage() for r in caplog.records
    )
    await kubelet.close()


async def test_after_a_reboot_the_specs_written_again_still_name_the_whole_holding(
    node: DraNode, api: ApiServerStandIn
) -> None:
    driver = await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    kubelet = await node.kubelet(driver)
    pod = ("two", str(uuid.uuid4()))
    claims = [node.claim("a", ["gpu-0"], pod=pod), node.claim("b", ["gpu-1"], pod=pod)]
    store_pod(api, *pod, {"main": ["a", "b"]}, templates=["a", "b"])
    ids = await prepared_ids(node, kubelet, claims)
    await kubelet.close()
    await node.stop(driver)
    node.reboot()
    await node.start()
    chip = uuids(node)
    held = {chip["gpu-0"], chip["gpu-1"]}
    for cdi_id in ids["a"] + ids["b"]:
        assert_told(device_env(node, cdi_id), held, held, f"{cdi_id} after the reboot")
