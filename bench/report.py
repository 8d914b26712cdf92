"""The figures the benchmarks produce, their targets, and the table that shows them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One reported number: where it sits in the results, and the limit it must stay under, if any."""

    section: str
    label: str
    path: tuple[str, ...]
    unit: str
    limit: float | None = None

    def value(self, sections: Mapping[str, Any]) -> float:
        """The figure's value in sections (an int for counts)."""
        node: Any = sections[self.section]
        for key in self.path:
            node = node[key]
        return node

    def met(self, sections: Mapping[str, Any]) -> bool | None:
        """Whether the value is under the limit; None without a limit."""
        return None if self.limit is None else self.value(sections) < self.limit


NODES = (("one_gpu", "1 GPU"), ("large", "2,048 devices"))
MODES = (("sequential", "sequential"), ("concurrent", "16 callers"))


def _startup() -> Iterator[Figure]:
    for key, name in NODES:
        yield Figure("startup", f"{name}: start -> Register ok, median", (key, "to_register", "median_ms"), "ms", 1000)
        yield Figure("startup", f"{name}: start -> full list, median", (key, "to_list", "median_ms"), "ms")


def _reregistration() -> Iterator[Figure]:
    for key, name in NODES:
        yield Figure("reregistration", f"{name}: restart -> listed, median", (key, "median_ms"), "ms", 200)
        yield Figure("reregistration", f"{name}: restart -> listed, max", (key, "max_ms"), "ms")


def _health(sections: Mapping[str, Any]) -> Iterator[Figure]:
    limit = sections["health"]["interval_s"] * 1000 + 100
    for key, name in (("to_unhealthy", "Unhealthy"), ("to_healthy", "Healthy again")):
        yield Figure("health", f"file -> {name} at kubelet, median", (key, "median_ms"), "ms")
        yield Figure("health", f"file -> {name} at kubelet, max", (key, "max_ms"), "ms", limit)


def _latency() -> Iterator[Figure]:
    for key, name in NODES:
        for call, call_name, limit in (("allocate", "Allocate", 2), ("preferred", "GetPreferredAllocation", 5)):
            judged = call == "allocate" or key == "large"
            for mode, mode_name in MODES:
                path = (key, call, mode)
                label = f"{name}: {call_name} {mode_name}"
                yield Figure("latency", f"{label} p50", (*path, "p50_ms"), "ms")
                yield Figure("latency", f"{label} p99", (*path, "p99_ms"), "ms", limit if judged else None)
                yield Figure("latency", f"{label} throughput", (*path, "calls_per_s"), "calls/s")


_PLACEMENT = (
    ("replicas_2048", "8 of 2,048 replicas (large node)"),
    ("chips_32", "8 of 21 whole chips (16 x BI-V150 split, PCIe links)"),
    ("chips_512", "8 of 341 whole chips (256 x BI-V150 split, NUMA nodes)"),
)


def _placement() -> Iterator[Figure]:
    for key, name in _PLACEMENT:
        yield Figure("placement", f"preferred() in-process, {name}: p50", (key, "p50_ms"), "ms")
        yield Figure("placement", f"preferred() in-process, {name}: p99", (key, "p99_ms"), "ms")


def _listandwatch() -> Iterator[Figure]:
    yield Figure("listandwatch", "list_response(plan), median", ("encode", "build", "median_ms"), "ms")
    yield Figure("listandwatch", "SerializeToString, median", ("encode", "serialize", "median_ms"), "ms")
    yield Figure("listandwatch", "message size", ("encode", "bytes"), "bytes")
    yield Figure("listandwatch", "fresh stream -> full list at client, median", ("fresh_stream", "median_ms"), "ms")
    yield Figure("listandwatch", "build + delivery, median", ("build_plus_delivery_ms",), "ms", 20)
    yield Figure("listandwatch", "config edit -> new list at client, median", ("config_edit_push", "median_ms"), "ms")
    yield Figure("listandwatch", "config edit -> new list at client, max", ("config_edit_push", "max_ms"), "ms")


def _footprint() -> Iterator[Figure]:
    yield Figure("footprint", "RSS after start", ("rss_start_mib",), "MiB")
    yield Figure("footprint", "RSS after half the calls", ("rss_half_mib",), "MiB")
    yield Figure("footprint", "RSS after all calls", ("rss_after_calls_mib",), "MiB")
    yield Figure("footprint", "RSS growth over the second half", ("rss_growth_second_half_mib",), "MiB", 2)
    yield Figure("footprint", "idle CPU, health interval 5 s", ("idle_cpu_percent",), "% core", 0.5)
    yield Figure("footprint", "threads after start", ("threads_start",), "")
    yield Figure("footprint", "threads after all calls", ("threads_after_calls",), "")
    yield Figure("footprint", "CPU per call under load", ("cpu_us_per_call",), "us")


_CALLS = (("allocate", "Allocate"), ("preferred", "GetPreferredAllocation"))


def _baseline() -> Iterator[Figure]:
    for call, call_name in _CALLS:
        for mode, mode_name in MODES:
            yield Figure("baseline", f"floor: {call_name} {mode_name} p50", (call, mode, "p50_ms"), "ms")
            yield Figure("baseline", f"floor: {call_name} {mode_name} p99", (call, mode, "p99_ms"), "ms")
    for mode, mode_name in MODES:  # the two calls' ratios side by side
        for call, call_name in _CALLS:
            yield Figure("baseline", f"plugin/floor p50: {call_name} {mode_name}", ("ratio_p50", f"{call}_{mode}"), "x")
    yield Figure("baseline", "floor server RSS", ("rss_mib",), "MiB")


def _stops() -> Iterator[Figure]:
    yield Figure("stops", "SIGTERMs under load (both cores busy)", ("stops",), "")
    yield Figure("stops", "stops not clean (exit != 0, socket left, > 2 s)", ("failed",), "", 1)
    yield Figure("stops", "SIGTERM -> exit, median", ("median_ms",), "ms")
    yield Figure("stops", "SIGTERM -> exit, max", ("max_ms",), "ms", 2000)


def _kubeclient(sections: Mapping[str, Any]) -> Iterator[Figure]:
    yield Figure("kubeclient", "daemon imported, RSS", ("daemon_rss_mib",), "MiB")
    for client in sorted(key for key, value in sections["kubeclient"].items() if isinstance(value, dict)):
        yield Figure("kubeclient", f"{client}: import", (client, "import_ms"), "ms")
        yield Figure("kubeclient", f"{client}: RSS added by import", (client, "rss_added_by_import_mib"), "MiB")
        yield Figure("kubeclient", f"{client}: RSS added, one request", (client, "rss_added_with_request_mib"), "MiB")


def _hostile() -> Iterator[Figure]:
    yield Figure("hostile", "hostile inputs refused", ("cases",), "")
    yield Figure("hostile", "slowest refusal", ("worst_ms",), "ms", 1000)
    yield Figure("hostile", "largest peak memory while refusing", ("worst_peak_kib",), "KiB", 64 * 1024)
    yield Figure("hostile", "agent, API answers without end: peak RSS", ("agent", "peak_rss_mib"), "MiB", 150)
    yield Figure("hostile", "agent, API answers without end: Allocate refused", ("agent", "allocate_refused_ms"), "ms")
    yield Figure("hostile", "agent, API answers without end: SIGTERM -> exit", ("agent", "stop_s"), "s", 2)


def _node_agent() -> Iterator[Figure]:
    for key, name in (("off", "parts off"), ("on", "CDI + labels + telemetry on")):
        yield Figure("node_agent", f"32 chips, {name}: RSS", (key, "rss_mib"), "MiB")
        yield Figure("node_agent", f"32 chips, {name}: idle CPU", (key, "idle_cpu_percent"), "% core")
    yield Figure("node_agent", "RSS added by the parts", ("rss_added_mib",), "MiB", 8)
    yield Figure("node_agent", "idle CPU added by the parts", ("idle_cpu_added_percent",), "% core", 0.1)
    yield Figure("node_agent", "one telemetry pass, simulated", ("pass", "simulated_sample_ms"), "ms")
    yield Figure("node_agent", "one telemetry pass, IXML binding (C double)", ("pass", "ixml_double_sample_ms"), "ms")
    yield Figure("node_agent", "rendering the 32-chip exposition", ("pass", "render_ms"), "ms")


def _dra() -> Iterator[Figure]:
    yield Figure("dra", "start -> registration served, median", ("to_registration", "median_ms"), "ms", 1000)
    yield Figure("dra", "start -> ResourceSlice published, median", ("to_slice", "median_ms"), "ms")
    yield Figure("dra", "start -> boards published too, median", ("to_whole_pool", "median_ms"), "ms")
    yield Figure("dra", "NodePrepareResources p50", ("prepare", "p50_ms"), "ms")
    yield Figure("dra", "NodePrepareResources p99", ("prepare", "p99_ms"), "ms", 50)
    yield Figure("dra", "NodePrepareResources of a board p99", ("prepare_board", "p99_ms"), "ms", 50)
    yield Figure("dra", "NodePrepareResources of a share, 4 at once, p99", ("prepare_share_4_at_once", "p99_ms"), "ms")
    yield Figure(
        "dra",
        "NodePrepareResources of a pod's 2 claims in 1 container, p99",
        ("prepare_pod_of_two_claims", "p99_ms"),
        "ms",
    )
    yield Figure("dra", "NodeUnprepareResources p99", ("unprepare", "p99_ms"), "ms")
    yield Figure("dra", "RSS after start", ("rss_start_mib",), "MiB")
    yield Figure("dra", "RSS after the prepares", ("rss_after_prepares_mib",), "MiB")
    yield Figure("dra", "XID -> kubelet health stream, max", ("xid_to_kubelet_health", "max_ms"), "ms", 1000)
    yield Figure("dra", "XID -> ResourceSlice taint, max", ("xid_to_slice_taint", "max_ms"), "ms", 1000)


def _dra_api() -> Iterator[Figure]:
    # a pool of two slices (the devices, the boards' counter sets): one write each
    yield Figure("dra_api", "DRA driver: slice writes at start, per node", ("start_slice_writes",), "", 3)
    yield Figure("dra_api", "DRA driver: requests at idle, per node", ("idle", "requests_per_hour"), "/h", 1)
    yield Figure("dra_api", "DRA driver: watches opened at idle, per node", ("idle", "watch_opens_per_hour"), "/h")
    path = ("node_recreated", "slice_writes_to_follow")
    yield Figure("dra_api", "Node re-created: slice writes until its slices follow", path, "")
    path = ("node_recreated", "slice_writes_per_minute_after")
    yield Figure("dra_api", "Node re-created: slice writes after, per minute", path, "/min", 1)


def _dra_node() -> Iterator[Figure]:
    for key, name in (("telemetry_off", "telemetry off"), ("telemetry_on", "telemetry on (15 s)")):
        yield Figure("dra_node", f"DRA driver, 32 chips, labels on, {name}: RSS", (key, "rss_mib"), "MiB")
        yield Figure(
            "dra_node", f"DRA driver, 32 chips, labels on, {name}: idle CPU", (key, "idle_cpu_percent"), "% core"
        )
    yield Figure("dra_node", "RSS added by telemetry", ("rss_added_by_telemetry_mib",), "MiB", 8)
    yield Figure("dra_node", "pod-resources List calls a minute", ("pod_resources_calls_per_minute",), "/min", 5)


def _api_features() -> Iterator[Figure]:
    yield Figure("api_features", "1 GPU, API features off: RSS", ("off", "rss_mib"), "MiB")
    yield Figure("api_features", "1 GPU, per-node config + Volcano on: RSS", ("on", "rss_mib"), "MiB")
    yield Figure("api_features", "RSS added by the API features", ("rss_added_mib",), "MiB")
    for feature, name in (("per_node_config", "per-node config"), ("gpu_reset", "GPU reset"), ("volcano", "Volcano")):
        path = ("idle", feature)
        yield Figure("api_features", f"{name}: requests at idle, per node", (*path, "requests_per_hour"), "/h", 1)
        yield Figure("api_features", f"{name}: watches opened at idle, per node", (*path, "watch_opens_per_hour"), "/h")
    for ending, name in (("expired", "every watch answered 410"), ("ended_at_once", "every watch ended at once")):
        path = ("hostile_watches", ending, "requests_per_s")
        yield Figure("api_features", f"per-node config, {name}: requests", path, "/s", 1)


def _healing() -> Iterator[Figure]:
    yield Figure("healing", "chip free -> back in service, median", ("free_to_in_service", "median_ms"), "ms")
    yield Figure("healing", "chip free -> back in service, max", ("free_to_in_service", "max_ms"), "ms", 3000)
    yield Figure("healing", "DRA: claim unprepared -> taint gone, median", ("dra_free_to_untainted", "median_ms"), "ms")
    yield Figure("healing", "DRA: claim unprepared -> taint gone, max", ("dra_free_to_untainted", "max_ms"), "ms", 1000)
    yield Figure("healing", "Event writes per healing episode", ("event_writes_per_episode",), "")
    yield Figure("healing", "handshake ConfigMap writes per episode", ("handshake_writes_per_episode",), "")
    yield Figure("healing", "XID storm: Event writes", ("storm", "event_writes"), "")
    yield Figure("healing", "XID storm: Event writes per XID", ("storm", "writes_per_xid"), "", 0.05)


def _handover() -> Iterator[Figure]:
    yield Figure("handover", "lowest allocatable of 8 GPUs across the updates", ("lowest_allocatable",), "")
    yield Figure("handover", "new pod registered beside the old, median", ("registered_beside", "median_ms"), "ms")
    yield Figure("handover", "old pod stopped -> new pod acts, median", ("takeover_after_stop", "median_ms"), "ms")
    yield Figure("handover", "old pod stopped -> new pod acts, max", ("takeover_after_stop", "max_ms"), "ms", 1000)
    yield Figure("handover", "Allocate through the pod on standby, p99", ("allocate_on_standby", "p99_ms"), "ms")


def figures(sections: Mapping[str, Any]) -> list[Figure]:
    """Every figure of the sections present."""
    groups: dict[str, Any] = {
        "startup": _startup,
        "reregistration": _reregistration,
        "health": lambda: _health(sections),
        "listandwatch": _listandwatch,
        "latency": _latency,
        "placement": _placement,
        "footprint": _footprint,
        "baseline": _baseline,
        "stops": _stops,
        "hostile": _hostile,
        "kubeclient": lambda: _kubeclient(sections),
        "node_agent": _node_agent,
        "dra": _dra,
        "dra_api": _dra_api,
        "dra_node": _dra_node,
        "api_features": _api_features,
        "healing": _healing,
        "handover": _handover,
    }
    return [figure for name, group in groups.items() if name in sections for figure in group()]


def targets(sections: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each figure that has a target: its value, limit and whether it is met."""
    return [
        {
            "section": f.section,
            "figure": f.label,
            "value": f.value(sections),
            "unit": f.unit,
            "limit": f.limit,
            "met": f.met(sections),
        }
        for f in figures(sections)
        if f.limit is not None
    ]


def _number(value: float) -> str:
    if isinstance(value, int) or value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}"


def _verdict(figure: Figure, sections: Mapping[str, Any]) -> str:
    met = figure.met(sections)
    return "" if met is None else ("met" if met else "MISSED")


def table(sections: Mapping[str, Any]) -> str:
    """A plain-text table of every figure, its target and whether it is met."""
    rows = [("section", "figure", "value", "target", "")]
    for figure in figures(sections):
        value = f"{_number(figure.value(sections))} {figure.unit}".strip()
        target = "" if figure.limit is None else f"< {_number(figure.limit)} {figure.unit}".strip()
        rows.append((figure.section, figure.label, value, target, _verdict(figure, sections)))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
