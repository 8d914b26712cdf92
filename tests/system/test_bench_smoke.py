"""The benchmark suite's smoke mode runs every benchmark and writes complete, numeric results."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from helpers.support import REPO_ROOT

ROOT = REPO_ROOT
SECTIONS = (
    "startup",
    "reregistration",
    "health",
    "listandwatch",
    "latency",
    "baseline",
    "placement",
    "footprint",
    "stops",
    "hostile",
    "kubeclient",
    "node_agent",
    "dra",
    "dra_api",
    "dra_node",
    "api_features",
    "healing",
    "handover",
)


def _leaves(node, path=""):
    if isinstance(node, dict):
        assert node, f"{path} is empty"
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}")
    elif isinstance(node, list):
        assert node, f"{path} is empty"
        for index, value in enumerate(node):
            yield from _leaves(value, f"{path}[{index}]")
    else:
        yield path, node


def test_smoke_run_writes_every_section_with_numbers(tmp_path):
    output = tmp_path / "smoke.json"
    completed = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(output.read_text())

    assert results["mode"] == "smoke"
    assert set(results["sections"]) == set(SECTIONS)
    for name in SECTIONS:
        for path, value in _leaves(results["sections"][name], name):
            assert isinstance(value, int | float) and not isinstance(value, bool), f"{path} = {value!r}"
            assert math.isfinite(value), f"{path} = {value!r}"

    machine = results["machine"]
    assert machine["cpus"] >= 1
    assert machine["python"] and machine["grpcio"] and machine["protobuf"]
    assert results["targets"], "no figure was judged against a target"
    assert all(isinstance(target["met"], bool) for target in results["targets"])
    for section in SECTIONS:
        assert section in completed.stdout, f"the table has no {section} rows"
