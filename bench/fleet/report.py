"""`python -m bench.fleet.report RESULTS [--plots DIR]`: the fleet bench's results as Markdown tables, the model to
larger fleets, and (with --plots) PNG plots, as docs/scale.md shows them."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ix_device_plugin.apiserver.events import WATCH_SERVER_TIMEOUT

SHAPES = ("plain", "chip", "board", "extended", "share")
PHASES = ("start", "rest", "rollout", "xid", "apiserver_restart")
DEVICE_PLUGIN_PHASES = ("dp_start", "dp_rest", "dp_label_rollout", "dp_xid")  # the device plugin's fleet
ALL_PHASES = PHASES + DEVICE_PLUGIN_PHASES
MODEL_SIZES = (1_000, 5_000)
MEAN_WATCH_SECONDS = 1.5 * WATCH_SERVER_TIMEOUT  # a watch's timeoutSeconds is drawn from [240, 480)


def _sizes(fleet: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(fleet["sizes"].values(), key=lambda size: size["nodes"])


def _by_shape(size: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {placement["shape"]: placement for placement in size["scheduling"]}


def scheduler_table(fleet: dict[str, Any]) -> str:
    """Pods per second, bind latency and the ratio to the plain baseline, by shape and fleet size."""
    rows = ["| nodes | shape | pods bound | pods/s | vs plain | bind p50 | bind p99 |", "|---|---|---|---|---|---|---|"]
    for size in _sizes(fleet):
        shapes = _by_shape(size)
        plain = shapes.get("plain", {}).get("pods_per_second") or 0
        for shape in SHAPES:
            if (placed := shapes.get(shape)) is None:
                continue
            ratio = f"{placed['pods_per_second'] / plain:.2f}" if plain else "-"
            rows.append(
                f"| {size['nodes']} | {shape} | {placed['bound']}/{placed['pods']} | {placed['pods_per_second']} | "
                f"{ratio} | {_ms(placed['bind_p50_ms'])} | {_ms(placed['bind_p99_ms'])} |"
            )
    return "\n".join(rows)


def traffic_table(fleet: dict[str, Any]) -> str:
    """Our agents' requests by phase and fleet size, per node and in all."""
    rows = [
        "| nodes | phase | seconds | requests/node | writes/node | requests/s (all) | KiB in/node | KiB out/node "
        "| watches open |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size in _sizes(fleet):
        for phase in ALL_PHASES:
            if (figures := size["phases"].get(phase)) is None:
                continue
            rows.append(
                f"| {size['nodes']} | {phase} | {figures['seconds']} | {figures['requests_per_node']} | "
                f"{figures['writes_per_node']} | {figures['requests_per_second']} | "
                f"{figures['bytes_received_per_node'] / 1024:.1f} | {figures['bytes_sent_per_node'] / 1024:.1f} | "
                f"{figures['watches_open_at_end']} |"
            )
    return "\n".join(rows)


def requests_table(fleet: dict[str, Any]) -> str:
    """What the requests of each phase were, for the largest fleet: verb and resource, per node."""
    size = _sizes(fleet)[-1]
    rows = [f"| phase | requests per node ({size['nodes']} nodes) | errors |", "|---|---|---|"]
    for phase in ALL_PHASES:
        if (figures := size["phases"].get(phase)) is None:
            continue
        parts = [f"{count / size['nodes']:.2f} {what}" for what, count in figures["by_resource"].items()]
        errors = ", ".join(f"{code}: {count}" for code, count in figures["errors"].items()) or "none"
        rows.append(f"| {phase} | {'; '.join(parts) or 'none'} | {errors} |")
    return "\n".join(rows)


def claims_table(fleet: dict[str, Any]) -> str:
    """What preparing and unpreparing the chip pods' claims asked of the API server, per claim."""
    rows = ["| nodes | claims | prepare | unprepare | requests/claim | writes/claim | what, per claim |"]
    rows.append("|---|---|---|---|---|---|---|")
    for size in _sizes(fleet):
        if (figures := size["phases"].get("claims")) is None or not figures.get("claims"):
            continue
        claims = figures["claims"]
        parts = "; ".join(f"{count / claims:.2f} {what}" for what, count in figures["by_resource"].items())
        rows.append(
            f"| {size['nodes']} | {claims} | {figures['prepare_s']} s | {figures['unprepare_s']} s | "
            f"{figures['requests'] / claims:.2f} | {figures['writes'] / claims:.2f} | {parts or 'none'} |"
        )
    return "\n".join(rows)


def storage_table(fleet: dict[str, Any]) -> str:
    rows = ["| nodes | etcd bytes per node | slices' JSON per node | start: pool complete | API server exit |"]
    rows.append("|---|---|---|---|---|")
    for size in _sizes(fleet):
        start = size["phases"]["start"]
        rows.append(
            f"| {size['nodes']} | {size['etcd_bytes_per_node']:,} | {size['slice_json_bytes_per_node']:,} | "
            f"{start.get('pool_complete_s', '-')} s | {size['apiserver_exit_s']} s |"
        )
    return "\n".join(rows)


def _fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The least-squares line through log(x), log(y): y = a * x ** b, as (a, b)."""
    usable = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(usable) < 2:
        return None
    mean_x = sum(x for x, _ in usable) / len(usable)
    mean_y = sum(y for _, y in usable) / len(usable)
    spread = sum((x - mean_x) ** 2 for x, _ in usable)
    if spread == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in usable) / spread
    return math.exp(mean_y - slope * mean_x), slope


def model(fleet: dict[str, Any]) -> dict[str, Any]:
    """Our agents' load and the scheduler's throughput at MODEL_SIZES, from the largest measured fleet (per node
    figures, which are flat in N) and a power law fitted over the measured sizes (the scheduler)."""
    sizes = _sizes(fleet)
    largest = sizes[-1]
    phases = largest["phases"]
    projected: dict[str, Any] = {"from_nodes": largest["nodes"], "sizes": {}}
    for nodes in MODEL_SIZES:
        rest = phases["rest"]
        watches = round(rest["watches_open_at_end"] / largest["nodes"] * nodes)
        entry: dict[str, Any] = {
            "start_requests": round(phases["start"]["requests_per_node"] * nodes),
            "start_writes": round(phases["start"]["writes_per_node"] * nodes),
            "rollout_writes": round(phases["rollout"]["writes_per_node"] * nodes),
            "restart_requests": round(phases["apiserver_restart"]["requests_per_node"] * nodes),
            "rest_requests_per_hour": round(
                rest["requests_per_node"] * nodes * 3600 / rest["seconds"] + watches * 3600 / MEAN_WATCH_SECONDS
            ),
            "watches": watches,
            "etcd_mib": round(largest["etcd_bytes_per_node"] * nodes / 2**20, 1),
            "pods_per_second": {},
        }
        for shape in SHAPES:
            points = [(s["nodes"], _by_shape(s)[shape]["pods_per_second"]) for s in sizes if shape in _by_shape(s)]
            if (fitted := _fit(points)) is not None:
                a, b = fitted
                entry["pods_per_second"][shape] = round(a * nodes**b, 1)
        projected["sizes"][str(nodes)] = entry
    return projected


def model_table(projected: dict[str, Any]) -> str:
    rows = ["| | " + " | ".join(f"{int(n):,} nodes" for n in projected["sizes"]) + " |"]
    rows.append("|---|" + "---|" * len(projected["sizes"]))
    keys = [
        ("start_requests", "requests when every agent starts at once"),
        ("start_writes", "of which writes"),
        ("rollout_writes", "writes of a config rollout to every node"),
        ("restart_requests", "requests after an API server restart"),
        ("rest_requests_per_hour", "requests per hour at rest (watches opened again as the server ends them)"),
        ("watches", "watches held"),
        ("etcd_mib", "etcd MiB for the pools"),
    ]
    for key, label in keys:
        rows.append(f"| {label} | " + " | ".join(f"{entry[key]:,}" for entry in projected["sizes"].values()) + " |")
    for shape in SHAPES:
        values = [entry["pods_per_second"].get(shape) for entry in projected["sizes"].values()]
        if any(value is not None for value in values):
            rows.append(f"| scheduler pods/s, {shape} (fitted) | " + " | ".join(f"{v}" for v in values) + " |")
    return "\n".join(rows)


def plot(fleet: dict[str, Any], folder: Path) -> list[Path]:
    """PNG plots of the scheduler's throughput and of our agents' requests per node; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    sizes = _sizes(fleet)
    nodes = [size["nodes"] for size in sizes]
    figure, axes = plt.subplots(figsize=(7, 4))
    for shape in SHAPES:
        values = [_by_shape(size).get(shape, {}).get("pods_per_second") for size in sizes]
        if any(value is not None for value in values):
            axes.plot(nodes, values, marker="o", label=shape)
    axes.set_xlabel("nodes")
    axes.set_ylabel("pods bound per second")
    axes.set_title("kube-scheduler 1.37 on our slices, by request shape")
    axes.legend()
    axes.grid(True, alpha=0.3)
    scheduler = folder / "scheduler.png"
    figure.tight_layout()
    figure.savefig(scheduler, dpi=100)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(sizes)
    shown = [phase for phase in ALL_PHASES if any(phase in size["phases"] for size in sizes)]
    for offset, size in enumerate(sizes):
        values = [size["phases"].get(phase, {}).get("requests_per_node", 0) for phase in shown]
        axes.bar([i + offset * width for i in range(len(shown))], values, width, label=f"{size['nodes']} nodes")
    axes.set_xticks([i + width * (len(sizes) - 1) / 2 for i in range(len(shown))], shown, rotation=30)
    axes.set_ylabel("requests per node")
    axes.set_title("Our agents' API requests per node, by phase")
    axes.legend()
    traffic = folder / "api-requests.png"
    figure.tight_layout()
    figure.savefig(traffic, dpi=100)
    plt.close(figure)
    return [scheduler, traffic]


def render(fleet: dict[str, Any]) -> str:
    """Every table, in the order docs/scale.md shows them."""
    parts = [
        "## Scheduler\n\n" + scheduler_table(fleet),
        "## API server traffic\n\n" + traffic_table(fleet),
        "### What the requests are\n\n" + requests_table(fleet),
        "### Claims prepared and unprepared\n\n" + claims_table(fleet),
        "### Storage and restart\n\n" + storage_table(fleet),
        "## Model\n\n" + model_table(model(fleet)),
    ]
    return "\n\n".join(parts) + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet.report", description=__doc__)
    parser.add_argument("results", type=Path, help="a results file of `python -m bench --only fleet`")
    parser.add_argument("--plots", type=Path, help="write the PNG plots into this folder")
    args = parser.parse_args(argv)
    try:
        fleet = json.loads(args.results.read_text())["sections"]["fleet"]
    except (OSError, ValueError, KeyError) as error:
        print(f"{args.results}: not a fleet bench results file ({error})", file=sys.stderr)
        return 2
    print(render(fleet))
    if args.plots is not None:
        for path in plot(fleet, args.plots):
            print(f"plot: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
