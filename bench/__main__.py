"""`python -m bench [--smoke] [--output PATH] [--only SECTION ...]`: run the benchmarks, print and save them."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import (
    api_features,
    dra,
    dra_api,
    dra_node,
    fleet,
    footprint,
    handover,
    healing,
    health,
    hostile,
    kubeclient,
    latency,
    listwatch,
    machine,
    node_agent,
    placement,
    reregistration,
    startup,
    stops,
)
from bench.report import table, targets
from bench.settings import FULL, SMOKE, Settings

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "latest.json"
Runner = Callable[[Settings], Awaitable[dict[str, Any]]]


def _single(name: str, run: Callable[[Settings], Awaitable[dict[str, Any]]]) -> Runner:
    async def runner(settings: Settings) -> dict[str, Any]:
        return {name: await run(settings)}

    return runner


async def _latency(settings: Settings) -> dict[str, Any]:
    plugin, baseline = await latency.run(settings)
    return {"latency": plugin, "baseline": baseline}


RUNNERS: dict[str, Runner] = {
    "startup": _single("startup", startup.run),
    "reregistration": _single("reregistration", reregistration.run),
    "health": _single("health", health.run),
    "listandwatch": _single("listandwatch", listwatch.run),
    "latency": _latency,
    "placement": _single("placement", placement.run),
    "footprint": _single("footprint", footprint.run),
    "stops": _single("stops", stops.run),
    "hostile": _single("hostile", hostile.run),
    "kubeclient": _single("kubeclient", kubeclient.run),
    "node_agent": _single("node_agent", node_agent.run),
    "dra": _single("dra", dra.run),
    "dra_api": _single("dra_api", dra_api.run),
    "dra_node": _single("dra_node", dra_node.run),
    "api_features": _single("api_features", api_features.run),
    "healing": _single("healing", healing.run),
    "handover": _single("handover", handover.run),
    "fleet": _single("fleet", fleet.run),
}
OPT_IN = frozenset({"fleet"})  # run only when named: it needs the end-to-end build and takes tens of minutes


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected fleet sizes of at least 1 node, got {text!r}")
    return sizes


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny counts: proves every benchmark runs (seconds)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON results file (%(default)s)")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(RUNNERS),
        help="run only this benchmark (repeatable; latency has the baseline; fleet runs only when named)",
    )
    parser.add_argument(
        "--fleet-nodes",
        type=_sizes,
        help="fleet sizes of --only fleet, comma-separated (full run: 100,250,500; smoke: 5)",
    )
    parser.add_argument("--fleet-pods", type=int, help="pods per shape of --only fleet (full run: 1000)")
    parser.add_argument("--fleet-rest-seconds", type=float, help="the fleet's measured windows at rest (full run: 60)")
    return parser.parse_args(argv)


async def run_all(settings: Settings, names: Sequence[str]) -> dict[str, Any]:
    """The sections of the benchmarks named, in order; progress on stderr. SIGTERM cancels the run."""
    main_task = asyncio.current_task()
    assert main_task is not None
    # Cancelling unwinds through every `async with`, which stops the processes and removes their directories.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    sections: dict[str, Any] = {}
    for name in names:
        started = time.perf_counter()
        print(f"{name} ...", end="", file=sys.stderr, flush=True)
        sections.update(await RUNNERS[name](settings))
        print(f" {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return sections


def _with_fleet(settings: Settings, args: argparse.Namespace) -> Settings:
    chosen = {
        "fleet_nodes": args.fleet_nodes,
        "fleet_pods": args.fleet_pods,
        "fleet_rest_seconds": args.fleet_rest_seconds,
    }
    return replace(settings, **{name: value for name, value in chosen.items() if value is not None})


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks, print the table and write the JSON results."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    settings = _with_fleet(SMOKE if args.smoke else FULL, args)
    names = [name for name in RUNNERS if (name in args.only if args.only else name not in OPT_IN)]
    started = time.time()
    try:
        sections = asyncio.run(run_all(settings, names))
    except asyncio.CancelledError:
        print("\nstopped by SIGTERM", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("\nstopped by SIGINT", file=sys.stderr)
        return 128 + signal.SIGINT
    results = {
        "mode": "smoke" if settings.smoke else "full",
        "command": "python -m bench" + (" --smoke" if settings.smoke else ""),
        "started_unix": round(started, 3),
        "duration_s": round(time.time() - started, 1),
        "machine": machine.describe(),
        "sections": sections,
        "targets": targets(sections),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    if settings.smoke:
        print("smoke run: tiny counts; the figures only show that every benchmark ran")
    print(table(sections))
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
