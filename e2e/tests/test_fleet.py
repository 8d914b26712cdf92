"""The fleet bench in its small form: 20 hollow nodes' DRA drivers, then their device plugins, against a second,
real control plane (etcd, kube-apiserver, controller-manager, scheduler; no kubelet), as `python -m bench --only
fleet` runs it.

What each node asks of the API server is counted from the API server's audit log, so that a change that makes
every node of a fleet write or read more is caught here; the scheduler must place every pod of every shape.
Speed is not judged here (docs/scale.md has the full run's figures).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness.build import REPO_ROOT
from harness.components import Binaries

NODES = 20
RUN_TIMEOUT = 600


@pytest.fixture(scope="module")
def fleet(binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The small fleet run's results for its one size."""
    output = tmp_path_factory.mktemp("fleet") / "fleet.json"
    argv = [
        sys.executable, "-m", "bench", "--only", "fleet", "--fleet-nodes", str(NODES), "--fleet-pods", "100",
        "--fleet-rest-seconds", "10", "--output", str(output),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    assert done.returncode == 0, f"the fleet bench failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(Path(output).read_text())["sections"]["fleet"]["sizes"][str(NODES)]


def test_the_scheduler_places_every_pod_of_every_shape(fleet: dict[str, Any]) -> None:
    placed = {placement["shape"]: (placement["bound"], placement["pods"]) for placement in fleet["scheduling"]}
    assert set(placed) == {"plain", "chip", "board", "extended", "share"}
    assert all(bound == pods > 0 for bound, pods in placed.values()), placed


def test_a_starting_node_writes_each_object_once(fleet: dict[str, Any]) -> None:
    """Two slices (the chips and boards, their counters) created, the reset record created: nothing written twice;
    reads: the slices' and the Node's lists and watches, the Node and the reset record (404 the first time)."""
    start = fleet["phases"]["start"]
    assert start["by_resource"].get("create resourceslices") == 2 * NODES, start["by_resource"]
    assert start["writes_per_node"] == 3, start["by_resource"]
    assert start["requests_per_node"] <= 15, start["by_resource"]
    assert set(start["errors"]) <= {"404"}, start["errors"]


def test_a_fleet_at_rest_asks_nothing(fleet: dict[str, Any]) -> None:
    rest = fleet["phases"]["rest"]
    assert rest["requests"] == 0, rest["by_resource"]
    assert rest["watches_open_at_end"] == 2 * NODES  # the node's slices and its Node, one watch each


def test_after_an_api_server_restart_nodes_rewatch_and_write_nothing(fleet: dict[str, Any]) -> None:
    """From the SIGTERM on, for each of its two watches a node lists and watches again; the new API server
    answers before its authorizer has loaded the RBAC policy, so a first list may be refused (403) and made
    again after the backoff."""
    restart = fleet["phases"]["apiserver_restart"]
    assert restart["writes"] == 0, restart["by_resource"]
    assert restart["requests_per_node"] <= 6, restart["by_resource"]
    assert set(restart["errors"]) <= {"403"}, restart["errors"]
    assert restart["watches_open_at_end"] == 2 * NODES


def test_a_config_rollout_writes_only_what_changed(fleet: dict[str, Any]) -> None:
    """Every driver restarted with other slices: each node replaces its slice and deletes the counters it no
    longer needs; its reset record, unchanged, is not written again."""
    rollout = fleet["phases"]["rollout"]
    assert rollout["writes_per_node"] <= 2, rollout["by_resource"]
    assert "update configmaps" not in rollout["by_resource"], rollout["by_resource"]
    assert not rollout["errors"], rollout["errors"]


def test_an_xid_costs_only_the_nodes_that_have_one(fleet: dict[str, Any]) -> None:
    xid = fleet["phases"]["xid"]
    assert 0 < xid["writes"] <= 6 * xid["nodes_with_xid"], xid["by_resource"]


def test_a_claim_costs_two_reads_and_a_write_to_prepare_and_a_read_and_a_write_to_unprepare(
    fleet: dict[str, Any],
) -> None:
    """Prepared: the claim read, its pod read, status.devices written (from the claim as read); unprepared: the
    claim read, its entries taken out. Every write accepted by the real API server (1.37 asks for
    resourceclaims/driver permission as well)."""
    claims = fleet["phases"]["claims"]
    assert claims["claims"] > 0 and not claims["errors"], claims["errors"]
    by_resource = claims["by_resource"]
    assert by_resource.get("patch resourceclaims/status") == 2 * claims["claims"], by_resource
    assert claims["requests"] <= 5 * claims["claims"], by_resource


def test_a_starting_device_plugin_writes_its_volcano_config_map_once(fleet: dict[str, Any]) -> None:
    """The device plugins (per-node config, Volcano mode, self-healing) started at once on the same nodes: each
    creates ix-device-info-cm-<node> and writes nothing else; reads: a list and a watch each of its Node (one
    watch for the label and the operator's annotation), its ConfigMap and its pods."""
    start = fleet["phases"]["dp_start"]
    assert start["by_resource"].get("create configmaps") == NODES, start["by_resource"]
    assert start["writes_per_node"] == 1, start["by_resource"]
    assert start["requests_per_node"] <= 8, start["by_resource"]
    assert not start["errors"], start["errors"]


def test_a_device_plugin_fleet_at_rest_asks_nothing(fleet: dict[str, Any]) -> None:
    rest = fleet["phases"]["dp_rest"]
    assert rest["requests"] == 0, rest["by_resource"]
    assert rest["watches_open_at_end"] == 3 * NODES  # its Node (label and annotation), its ConfigMap, its pods


def test_a_node_label_rollout_writes_each_config_map_once(fleet: dict[str, Any]) -> None:
    """The label naming the key `replicas` set on every node at once: each plugin rewrites its Volcano ConfigMap
    (the replicas are other devices), and asks nothing else."""
    rollout = fleet["phases"]["dp_label_rollout"]
    assert rollout["writes_per_node"] <= 1, rollout["by_resource"]
    assert rollout["requests_per_node"] <= 2, rollout["by_resource"]
    assert not rollout["errors"], rollout["errors"]


def test_a_device_plugin_xid_costs_only_the_nodes_that_have_one(fleet: dict[str, Any]) -> None:
    xid = fleet["phases"]["dp_xid"]
    assert 0 < xid["writes"] <= 6 * xid["nodes_with_xid"], xid["by_resource"]
