"""The Grafana dashboard queries only metrics the plugin exports, and the chart ships it for Grafana's sidecar."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from helpers.dra_support import DraNode
from helpers.manifest_support import CHART_DIR, load_render_module, needs_helm
from helpers.support import REPO_ROOT, RESOURCE, DaemonFactory
from helpers.waits import until
from prometheus_client.parser import text_string_to_metric_families

from ix_device_plugin.dra.slices import DRIVER
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import ClaimResource, PodClaim, PodResourcesStandIn

DASHBOARD = REPO_ROOT / "deployments" / "grafana" / "ix-device-plugin.json"
# Series names Prometheus derives from a family, by its type.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "info": ("_info",),
    "gauge": ("",),
}
PROMQL_WORDS = {"sum", "by", "count", "rate", "increase", "histogram_quantile", "label_values", "le", "without"}
# What only one front end exports: the device plugin's own API, and the DRA driver's claims.
DEVICE_PLUGIN_ONLY = re.compile(r"^ix_device_plugin_(call|registration_failures|reregistrations|config_reload)")
DRA_ONLY = re.compile(r"^ix_device_plugin_dra_")
render = load_render_module()


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels that show something (rows only group them)."""
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and templating queries."""
    found = [target["expr"] for panel in panels(dashboard) for target in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["query"]["query"])
    return found


def metric_names(expression: str) -> set[str]:
    """The metric names an expression reads (label matchers, strings and functions left out)."""
    without_label_names = re.sub(r"label_values\(([^,()]+),[^)]*\)", r"\1", expression)
    without_strings = re.sub(r'"[^"]*"', '""', without_label_names)
    without_matchers = re.sub(r"\{[^}]*\}", "", without_strings)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_matchers)
    without_groupings = re.sub(r"\b(by|without)\s*\([^)]*\)", "", without_ranges)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_groupings))
    return {name for name in names if name not in PROMQL_WORDS}


def label_names(expression: str) -> set[str]:
    """The label names an expression selects on or groups by."""
    grouped = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expression)
    names = {name.strip() for group in grouped for name in group.split(",") if name.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", expression):
        names.update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return names - {"le"}


async def exported_series(daemon_port: int) -> set[str]:
    """The series names on the agent's /metrics."""
    return (await exported(daemon_port))[0]


async def exported(daemon_port: int) -> tuple[set[str], set[str]]:
    """The series names on the agent's /metrics, and every label name they carry."""

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon_port}/metrics", timeout=5) as response:
            return response.read().decode()

    series: set[str] = set()
    labels: set[str] = set()
    for family in text_string_to_metric_families(await asyncio.to_thread(scrape)):
        series.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        labels.update(name for sample in family.samples for name in sample.labels)
    return series, labels


def test_the_dashboard_is_grafana_json_with_a_query_per_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "ix-device-plugin"
    titles = [panel["title"] for panel in dashboard["panels"]]
    assert len(titles) == len(set(titles))
    for panel in panels(dashboard):
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert metric_names(target["expr"]), f"{panel['title']}: {target['expr']} reads no metric"
    healing = ("GPUs out of service", "Self-healing resets", "Self-healing outcomes", "Time out of service")
    for wanted in (
        "Devices by health",
        "GPUs allocated per pod",
        "GPU utilization",
        "Memory used",
        "Temperature",
        *healing,
    ):
        assert wanted in titles
    for wanted in ("Claims per chip", "Shares in use"):  # what DRA adds
        assert wanted in titles
    assert any("registered" in title.lower() for title in titles)
    assert any("latency" in title.lower() for title in titles)


async def test_every_query_names_a_metric_the_plugin_exports(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    daemon = await start_daemon("BI-V150:2", health_address="127.0.0.1:0", telemetry_interval=0.1)
    await kubelet.wait_registered(RESOURCE)
    await until(lambda: bool(daemon.node.telemetry and daemon.node.telemetry.samples))
    exported = await exported_series(daemon.node.probe_port)
    for expression in queries(json.loads(DASHBOARD.read_text())):
        unknown = {name for name in metric_names(expression) - exported if not DRA_ONLY.match(name)}
        assert not unknown, f"{expression}: the plugin exports no {sorted(unknown)}"


async def test_the_dashboard_works_unchanged_on_a_dra_node(
    short_dir: Path, apiserver: ApiServerStandIn, pod_resources: PodResourcesStandIn
) -> None:
    """Every query but those of the device plugin's own API reads metrics and labels the DRA driver exports."""
    node = DraNode(short_dir, apiserver)
    try:
        driver = await node.start(
            health_address="127.0.0.1:0",
            telemetry_interval=0.05,
            pod_resources_socket=pod_resources.socket_path,
            config=Config(splitboard=True, replicas=2),
        )
        share = "6a3b1a4e-0000-4000-8000-000000000001"
        resource = ClaimResource(DRIVER, node.node, "gpu-0", (), share)
        pod_resources.claims = {("ml", "job"): {"main": [PodClaim("train", (resource,))]}}
        telemetry = driver.node.telemetry
        assert telemetry is not None
        await until(lambda: bool(telemetry.holders))
        series, labels = await exported(driver.node.probe_port)
    finally:
        await node.stop_all()
    for expression in queries(json.loads(DASHBOARD.read_text())):
        unknown = {name for name in metric_names(expression) - series if not DEVICE_PLUGIN_ONLY.match(name)}
        assert not unknown, f"{expression}: the DRA driver exports no {sorted(unknown)}"
        if not any(DEVICE_PLUGIN_ONLY.match(name) for name in metric_names(expression)):
            assert label_names(expression) <= labels, f"{expression}: labels {label_names(expression) - labels}"


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar_only_when_asked() -> None:
    needs_helm()

    def configmaps(overrides: dict[str, Any]) -> list[dict[str, Any]]:
        objects = render.load_objects(render.render_chart(CHART_DIR, overrides))
        return [obj for obj in objects if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].endswith("dashboard")]

    assert configmaps({}) == []
    (shipped,) = configmaps({"dashboard": {"enabled": True}})
    assert shipped["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(shipped["data"]["ix-device-plugin.json"]) == json.loads(DASHBOARD.read_text())
