"""Volcano's capacity plugin charges our claim shapes as docs/quota-volcano.md says, and admits and refuses by it.

Component level: Volcano's own scheduler cache, session and capacity plugin (the release the tool's go.mod pins)
run in-process by e2e/cluster/tools/volcano-charge, over pods and ResourceClaims as the API server holds them; no
vc-scheduler runs. The documented charges are read from the doc's table, so the doc and Volcano cannot part.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers.volcano_quota import charge_tool, run_cases, volcano_version

pytestmark = pytest.mark.system

DOC = Path(__file__).resolve().parents[2] / "docs" / "quota-volcano.md"
TABLE_HEADING = "## What each claim shape is charged"
NAMESPACE = "team"
CHIP, BOARD, SHARE = "gpu.iluvatar.com", "board.gpu.iluvatar.com", "share.gpu.iluvatar.com"
WORKLOAD = {"cpu": "100m"}  # a pod that requests nothing is BestEffort to Volcano: placed by backfill, not allocate


def exactly(device_class: str, **fields: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": device_class, **fields}}


SHAPES: dict[str, dict[str, Any]] = {
    "chip": {"requests": [exactly(CHIP)]},
    "two chips of a board": {
        "requests": [exactly(CHIP, count=2)],
        "constraints": [{"requests": ["gpu"], "matchAttribute": "gpu.iluvatar.com/boardUUID"}],
    },
    "board": {"requests": [exactly(BOARD)]},
    "one share": {"requests": [exactly(SHARE)]},
    "one share, asked for": {"requests": [exactly(SHARE, capacity={"requests": {"shares": "1"}})]},
    "two shares": {"requests": [exactly(SHARE, capacity={"requests": {"shares": "2"}})]},
    "two shares through gpu.iluvatar.com": {"requests": [exactly(CHIP, capacity={"requests": {"shares": "2"}})]},
    "chip with admin access": {"requests": [exactly(CHIP, adminAccess=True)]},
    "all chips": {"requests": [exactly(CHIP, allocationMode="All")]},
    "firstAvailable": {
        "requests": [
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "board", "deviceClassName": BOARD},
                    {"name": "chips", "deviceClassName": CHIP, "count": 2},
                ],
            }
        ]
    },
    "iluvatar.com/gpu: 2 through DRA": {"requests": None, "pod_requests": {"iluvatar.com/gpu": "2"}},
    "one claim by name in two pods": {"requests": [exactly(CHIP)], "by_name": True, "pods": 2},
}
BY_NAME = "one claim by name in two pods"


def documented_charges() -> dict[str, dict[str, int]]:
    """The doc's table: shape -> {queue key: quantity} (an empty dict where it says nothing is charged)."""
    text = DOC.read_text()
    assert TABLE_HEADING in text, f"{DOC} has no section {TABLE_HEADING!r}"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|--")]
    charges = {}
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        found = re.findall(r"`([\w./-]+): (\d+)`", cells[2])
        assert found or cells[2].startswith("nothing"), f"{DOC}: no charge in the row {row!r}"
        charges[cells[0]] = {key: int(value) for key, value in found}
    return charges


def claim(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    devices = {"requests": spec["requests"], **({"constraints": spec["constraints"]} if "constraints" in spec else {})}
    return {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"devices": devices}}


def pod(name: str, spec: dict[str, Any], claim_name: str | None) -> dict[str, Any]:
    """A pod of the shape: its claim by name, or from a template with the claim the controller made for it."""
    requests = {**WORKLOAD, **spec.get("pod_requests", {})}
    container = {"name": "main", "resources": {"requests": requests, "limits": spec.get("pod_requests", {})}}
    body: dict[str, Any] = {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"containers": [container]}}
    if claim_name is None:
        return body
    container["resources"]["claims"] = [{"name": "gpu"}]
    if spec.get("by_name"):
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
        return body
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}]
    body["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}]}
    return body


def case(name: str, shape: str, capability: dict[str, int] | None = None, copies: int = 1) -> dict[str, Any]:
    """A session over copies of the shape's workload (each its own pods and claims) in a queue of capability."""
    spec = SHAPES[shape]
    claims, pods = [], []
    for copy in range(copies):
        claim_name = None if spec["requests"] is None else f"claim-{copy}"
        if claim_name is not None:
            claims.append(claim(claim_name, spec))
        pods += [pod(f"pod-{copy}-{i}", spec, claim_name) for i in range(spec.get("pods", 1))]
    quota = {key: str(value) for key, value in (capability or {}).items()}
    return {"name": name, "capability": quota, "claims": claims, "pods": pods}


def charged(result: dict[str, Any]) -> dict[str, int]:
    """The queue's allocated without what the workload's cpu request and pod count add."""
    return {key: int(value) for key, value in result["queueAllocated"].items() if key not in ("cpu", "pods")}


@pytest.fixture(scope="module")
def volcano() -> Path:
    return charge_tool()


def test_the_tool_is_built_with_the_documented_volcano(volcano: Path) -> None:
    version = volcano_version(volcano)
    assert f"Volcano {version}" in DOC.read_text(), f"{DOC} does not name Volcano {version}, which the check ran"


def test_the_doc_and_the_check_have_the_same_shapes() -> None:
    assert sorted(documented_charges()) == sorted(SHAPES)


def test_each_shape_is_charged_as_documented(volcano: Path) -> None:
    results = run_cases(volcano, [case(shape, shape) for shape in SHAPES])
    for shape, charge in documented_charges().items():
        assert len(results[shape]["allocated"]) == SHAPES[shape].get("pods", 1), f"{shape}: {results[shape]}"
        assert charged(results[shape]) == charge, f"{shape}: Volcano charged {results[shape]['queueAllocated']}"


def test_a_queue_admits_a_shape_that_exactly_fits_and_refuses_one_unit_over(volcano: Path) -> None:
    charges = {shape: charge for shape, charge in documented_charges().items() if charge and shape != BY_NAME}
    cases = []
    for shape, charge in charges.items():
        cases.append(case(f"{shape} fits", shape, charge))
        for key in charge:  # two workloads, the queue one unit short of both in this key alone
            short = {k: 2 * v - (k == key) for k, v in charge.items()}
            cases.append(case(f"{shape} over in {key}", shape, short, copies=2))
    results = run_cases(volcano, cases)
    for shape, charge in charges.items():
        assert len(results[f"{shape} fits"]["allocated"]) == 1, results[f"{shape} fits"]
        for key in charge:
            over = results[f"{shape} over in {key}"]
            assert len(over["allocated"]) == 1 and charged(over) == charge, over


def test_a_claim_two_pods_name_is_charged_once_but_admitted_once_per_pod(volcano: Path) -> None:
    key = f"deviceclass/{CHIP}"
    results = run_cases(volcano, [case("one", BY_NAME, {key: 1}), case("two", BY_NAME, {key: 2})])
    assert results["one"]["allocated"] == ["pod-0-0"] and charged(results["one"]) == {key: 1}
    assert len(results["two"]["allocated"]) == 2 and charged(results["two"]) == {key: 1}


def test_shapes_charged_nothing_pass_any_queue(volcano: Path) -> None:
    full = {f"deviceclass/{CHIP}": 1, f"deviceclass/{BOARD}": 1}
    free = [shape for shape, charge in documented_charges().items() if not charge]
    results = run_cases(volcano, [case(shape, shape, full, copies=3) for shape in free])
    for shape in free:
        assert len(results[shape]["allocated"]) == 3, results[shape]


def test_a_count_of_zero_is_no_limit(volcano: Path) -> None:
    results = run_cases(volcano, [case("zero", "chip", {f"deviceclass/{CHIP}": 0}, copies=2)])
    assert len(results["zero"]["allocated"]) == 2


def test_shares_are_refused_by_a_queue_that_limits_the_class_but_not_its_shares(volcano: Path) -> None:
    results = run_cases(volcano, [case("no shares key", "one share, asked for", {f"deviceclass/{SHARE}": 10})])
    assert results["no shares key"]["allocated"] == []


def test_without_consumable_capacity_shares_are_charged_by_count_only(volcano: Path) -> None:
    cases = [case("two shares", "two shares", {f"deviceclass/{SHARE}": 1, f"shares.deviceclass/{SHARE}": 1})]
    result = run_cases(volcano, cases, consumable_capacity=False)["two shares"]
    assert len(result["allocated"]) == 1 and charged(result) == {f"deviceclass/{SHARE}": 1}


def test_a_pod_that_requests_nothing_else_is_still_held_to_the_queue(volcano: Path) -> None:
    best_effort = case("best effort", "chip", {f"deviceclass/{CHIP}": 1}, copies=2)
    for body in best_effort["pods"]:
        body["spec"]["containers"][0]["resources"]["requests"] = {}
    result = run_cases(volcano, [best_effort])["best effort"]
    assert len(result["allocated"]) == 1 and charged(result) == {f"deviceclass/{CHIP}": 1}
