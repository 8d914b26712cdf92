"""The Grafana dashboard queries only metrics the plugin exports, and the chart ships it for Grafana's sidecar."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from typing import Any

from manifest_support import CHART_DIR, load_render_module
from prometheus_client.parser import text_string_to_metric_families

from ix_device_plugin.standins.kubelet import KubeletStandIn

from support import REPO_ROOT, RESOURCE, DaemonFactory, until

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
render = load_render_module()


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and templating queries."""
    found = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
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


async def exported_series(daemon_port: int) -> set[str]:
    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon_port}/metrics", timeout=5) as response:
            return response.read().decode()

    series = set()
    for family in text_string_to_metric_families(await asyncio.to_thread(scrape)):
        series.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return series


def test_the_dashboard_is_grafana_json_with_a_query_per_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "ix-device-plugin"
    titles = [panel["title"] for panel in dashboard["panels"]]
    assert len(titles) == len(set(titles))
    for panel in dashboard["panels"]:
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
    assert any("registered" in title.lower() for title in titles)
    assert any("latency" in title.lower() for title in titles)


async def test_every_query_names_a_metric_the_plugin_exports(
    kubelet: KubeletStandIn, start_daemon: DaemonFactory
) -> None:
    daemon = await start_daemon("BI-V150:2", health_address="127.0.0.1:0", telemetry_interval=0.1)
    await kubelet.wait_registered(RESOURCE)
    await until(lambda: bool(daemon.telemetry and daemon.telemetry.samples))
    exported = await exported_series(daemon.probe_port)
    for expression in queries(json.loads(DASHBOARD.read_text())):
        unknown = metric_names(expression) - exported
        assert not unknown, f"{expression}: the plugin exports no {sorted(unknown)}"


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar_only_when_asked() -> None:
    def configmaps(overrides: dict[str, Any]) -> list[dict[str, Any]]:
        objects = render.load_objects(render.render_chart(CHART_DIR, overrides))
        return [obj for obj in objects if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].endswith("dashboard")]

    assert configmaps({}) == []
    (shipped,) = configmaps({"dashboard": {"enabled": True}})
    assert shipped["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(shipped["data"]["ix-device-plugin.json"]) == json.loads(DASHBOARD.read_text())
