"""The fleet bench's accounting and report, on an audit log in kube-apiserver's format and a results file in the
bench's: requests counted once each, dry runs apart from writes, windows, open watches, the tables and the model.

The bench itself needs the real control plane; it runs in the end-to-end suite (e2e/tests/test_fleet.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.support import REPO_ROOT

from bench.fleet import agents, deviceplugin, report, traffic
from ix_device_plugin.settings.options import config_file_for, load_config

T0 = 1_800_000_000.0


def _stamp(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + seconds, UTC).isoformat().replace("+00:00", "Z")


def _event(audit_id: str, stage: str, verb: str, resource: str, at: float, code: int = 200, uri: str = "/") -> dict:
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": audit_id,
        "stage": stage,
        "requestURI": uri,
        "verb": verb,
        "user": {"username": "ix-fleet-agent-0", "groups": ["ix-fleet:agents"]},
        "objectRef": {"resource": resource, "apiGroup": "resource.k8s.io"},
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": _stamp(at),
        "stageTimestamp": _stamp(at + 0.01),
    }


def _audit(path: Path) -> Path:
    events = [
        _event("w1", "ResponseStarted", "watch", "resourceslices", 1.0),
        _event("l1", "ResponseComplete", "list", "resourceslices", 1.5),
        _event("d1", "ResponseComplete", "create", "resourceslices", 2.0, uri="/apis/x?dryRun=All"),
        _event("c1", "ResponseComplete", "create", "resourceslices", 2.5, code=201),
        _event("g1", "ResponseComplete", "get", "configmaps", 3.0, code=404),
        _event("w2", "ResponseStarted", "watch", "nodes", 4.0),
        _event("w2", "ResponseComplete", "watch", "nodes", 8.0),
    ]
    path.write_text("".join(json.dumps(event) + "\n" for event in events))
    return path


def test_each_request_is_counted_once_and_dry_runs_are_not_writes(tmp_path: Path) -> None:
    requests = traffic.read_audit(_audit(tmp_path / "audit.log"))

    assert [request.verb for request in requests] == ["watch", "list", "create", "create", "get", "watch"]
    figures = traffic.summary(traffic.window(requests, T0, T0 + 5), nodes=2, seconds=5)
    assert figures["requests"] == 6 and figures["writes"] == 1 and figures["writes_per_node"] == 0.5
    assert figures["by_resource"]["dry-run create resourceslices"] == 1
    assert figures["by_resource"]["create resourceslices"] == 1
    assert figures["errors"] == {"404": 1}


def test_windows_and_open_watches_follow_the_timestamps(tmp_path: Path) -> None:
    requests = traffic.read_audit(_audit(tmp_path / "audit.log"))

    assert len(traffic.window(requests, T0 + 2.0, T0 + 3.0)) == 2  # [start, end)
    assert traffic.watches_open(requests, T0 + 5) == 2  # the nodes watch ends at 8 s
    assert traffic.watches_open(requests, T0 + 9) == 1  # the slices watch never ended


def _phase(requests: float, writes: float) -> dict[str, Any]:
    return {
        "seconds": 30.0,
        "requests": requests * 10,
        "writes": writes * 10,
        "requests_per_node": requests,
        "writes_per_node": writes,
        "requests_per_second": requests / 3,
        "by_verb": {},
        "by_resource": {"create resourceslices": writes * 10} if writes else {},
        "errors": {},
        "watches_open_at_end": 20,
        "bytes_received_per_node": 2048,
        "bytes_sent_per_node": 1024,
    }


def _size(nodes: int, plain: float, chip: float) -> dict[str, Any]:
    phases = {name: _phase(4.0, 0.0) for name in report.PHASES}
    phases["start"] = _phase(13.0, 3.0) | {"pool_complete_s": 2.0}
    phases["rest"] = _phase(0.0, 0.0)
    phases["claims"] = _phase(5.0, 2.0) | {"claims": 25, "prepare_s": 1.5, "unprepare_s": 0.5}
    return {
        "nodes": nodes,
        "etcd_bytes_per_node": 30_000,
        "slice_json_bytes_per_node": 15_000,
        "apiserver_exit_s": 1.2,
        "phases": phases,
        "scheduling": [
            {"shape": "plain", "pods": 100, "bound": 100, "seconds": 2, "pods_per_second": plain,
             "bind_p50_ms": 500.0, "bind_p99_ms": 900.0},
            {"shape": "chip", "pods": 100, "bound": 100, "seconds": 4, "pods_per_second": chip,
             "bind_p50_ms": 800.0, "bind_p99_ms": 1500.0},
        ],
    }  # fmt: skip


def test_the_report_gives_ratios_to_the_baseline_and_a_model(tmp_path: Path) -> None:
    fleet = {"pods": 100, "rest_seconds": 30.0, "sizes": {"10": _size(10, 50.0, 25.0), "40": _size(40, 25.0, 12.5)}}

    text = report.render(fleet)
    assert "| 10 | chip | 100/100 | 25.0 | 0.50 | 800 ms | 1,500 ms |" in text
    assert "| 10 | 25 | 1.5 s | 0.5 s | 2.00 | 0.80 | 0.80 create resourceslices |" in text  # 50 requests, 20 writes
    projected = report.model(fleet)["sizes"]["1000"]
    assert projected["start_writes"] == 3000
    assert projected["watches"] == 500  # 20 watches for 40 nodes
    assert projected["rest_requests_per_hour"] == 5000  # none in the window; each watch opened again every 360 s
    assert abs(projected["pods_per_second"]["plain"] - 50.0 * (1000 / 10) ** -0.5) < 0.1  # halves when N x4

    results = tmp_path / "fleet.json"
    results.write_text(json.dumps({"sections": {"fleet": fleet}}))
    shown = subprocess.run(
        [sys.executable, "-m", "bench.fleet.report", str(results)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert shown.returncode == 0 and "## Model" in shown.stdout, shown.stderr


def test_a_file_that_is_not_a_fleet_result_is_named(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"sections": {}}))
    shown = subprocess.run(
        [sys.executable, "-m", "bench.fleet.report", str(other)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert shown.returncode == 2 and "other.json: not a fleet bench results file" in shown.stderr
    assert "Traceback" not in shown.stderr


def test_the_device_plugin_phases_are_in_the_traffic_tables() -> None:
    size = _size(10, 50.0, 25.0)
    size["phases"]["dp_start"] = _phase(9.0, 2.0) | {"config_maps_complete_s": 3.0}
    size["phases"]["dp_rest"] = _phase(0.0, 0.0)
    size["phases"]["dp_label_rollout"] = _phase(2.0, 1.0)
    fleet = {"pods": 100, "rest_seconds": 30.0, "sizes": {"10": size}}

    traffic_rows = report.traffic_table(fleet).splitlines()
    assert "| 10 | dp_start | 30.0 | 9.0 | 2.0 | 3.0 | 2.0 | 1.0 | 20 |" in traffic_rows
    assert "| 10 | dp_rest | 30.0 | 0.0 | 0.0 | 0.0 | 2.0 | 1.0 | 20 |" in traffic_rows
    assert [row.split(" | ")[1] for row in traffic_rows[2:]][-3:] == ["dp_start", "dp_rest", "dp_label_rollout"]
    request_rows = report.requests_table(fleet).splitlines()
    assert "| dp_rest | none | none |" in request_rows
    assert "| dp_label_rollout | 1.00 create resourceslices | none |" in request_rows


def test_a_volcano_config_map_lists_replicas_only_once_every_device_is_one() -> None:
    def data(devices: list[str]) -> dict[str, str]:
        return {deviceplugin.DEVICE_LIST_KEY: json.dumps({"DeviceList": devices, "UpdateTime": 1})}

    assert deviceplugin.replicas_listed(data(["GPU-a::0", "GPU-a::1", "GPU-b::0"]))
    assert not deviceplugin.replicas_listed(data(["GPU-a", "GPU-b"]))
    assert not deviceplugin.replicas_listed(data(["GPU-a::0", "GPU-b"]))
    assert not deviceplugin.replicas_listed(data([]))  # every device held or unhealthy: not known yet
    assert not deviceplugin.replicas_listed({})
    assert not deviceplugin.replicas_listed({deviceplugin.DEVICE_LIST_KEY: "not json"})


def test_the_hollow_plugins_config_keys_are_valid_and_the_label_picks_them(tmp_path: Path) -> None:
    spec = agents.AgentSpec(
        server="https://127.0.0.1:1", ca=str(tmp_path / "ca"), nodes=["n"], token_files=[str(tmp_path / "t")],
        boards=8, config={}, kind=agents.DEVICE_PLUGIN,
    )  # fmt: skip
    node = agents.HollowPluginNode(tmp_path, "n", tmp_path / "t", spec)
    options = node.plugin_options()

    default, _ = load_config(options, config_file_for(options, None)[0])
    replicas, _ = load_config(options, config_file_for(options, "replicas")[0])
    assert default.use_volcano and default.replicas == 0
    assert replicas.use_volcano and replicas.replicas == 4
    assert options.per_node_config and options.health_address == "off"
