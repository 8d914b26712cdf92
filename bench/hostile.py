"""Hostile input, the whole set: how long the agent takes to refuse each case, and the memory it needs to.

In process, each case timed (best of runs) and its peak traced memory measured:
- configs: every file of tests/hostile/configs through the loader `check-config` and the plugin use;
- documents: the reset handshake's gpuReset documents (an alias bomb, deep nesting, too large, a string flag);
- api: the API server stand-in's hostile answers against the real caps (a list without end, 300 MB declared,
  gzip nobody asked for, a watch event without end), each refused with a KubeError;
- ixsmi: a fake ixsmi printing non-UTF-8, printing 60 MB, overstaying its deadline with a child (the time
  counted is the time past the deadline), or exiting non-zero.
The agent (bench/hostile_agent.py): the plugin process with every API feature and telemetry on, against an
API server that answers everything without end: its peak resident memory, and how long SIGTERM takes.
"""

from __future__ import annotations

import contextlib
import shutil
import stat
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import hostile_agent
from bench.settings import Settings
from ix_device_plugin.apiserver.client import Kube, connect
from ix_device_plugin.apiserver.errors import KubeError
from ix_device_plugin.apiserver.objects import CONFIG_MAP, POD
from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.gpureset.document import GpuResetError, ResetInfo
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.ixml.reset import run_ixsmi_reset
from ix_device_plugin.settings.configmap import load_document
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import config_from
from ix_device_plugin.standins.apiserver import ApiServerStandIn, bodies

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "hostile" / "configs"
NODE = "bench-node"
Case = Callable[[], Awaitable[None]]
Measured = dict[str, tuple[float, float]]  # case -> (ms, peak KiB)

DOCUMENTS = {
    "alias_bomb": "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
    + "".join(f"{b}: &{b} [{','.join([f'*{a}'] * 10)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))
    + "nodename: *i\n",
    "nested_10000": "occupy: " + "[" * 10_000 + "]" * 10_000,
    "too_large": "x" * 200_000,
    "reset_a_string": "reset: 'false'\n",
}
IXSMI = {
    "not_utf8_exit_0": r"printf 'Reset \377\376 done\n'",
    "not_utf8_exit_7": r"printf 'GPU \377 is busy\n' >&2; exit 7",
    "output_60_mb": "head -c 60000000 /dev/zero | tr '\\0' x; exit 1",
    "child_and_hang": "sleep 30 & echo started; sleep 30",
}
IXSMI_TIMEOUT = 0.3


async def run(settings: Settings) -> dict[str, Any]:
    """Per group and case: refusal time (ms) and peak traced memory (KiB); the worst of all; the agent's figures."""
    runs = 1 if settings.smoke else 20
    measured: dict[str, Measured] = {
        "configs": await _all({path.name: _config_case(path.read_bytes()) for path in sorted(CORPUS.iterdir())}, runs),
        "documents": await _all({name: _document_case(text) for name, text in DOCUMENTS.items()}, runs),
        "ixsmi": await _ixsmi(1),
        "api": await _api(1 if settings.smoke else 3),
    }
    every = [(group, name, ms, kib) for group, cases in measured.items() for name, (ms, kib) in cases.items()]
    slowest = max(every, key=lambda case: case[2])
    hungriest = max(every, key=lambda case: case[3])
    return {
        "cases": len(every),
        "worst_ms": round(slowest[2], 3),
        "worst_peak_kib": round(hungriest[3], 1),
        "per_case": {
            group: {name: {"ms": round(ms, 3), "peak_kib": round(kib, 1)} for name, (ms, kib) in cases.items()}
            for group, cases in measured.items()
        },
        "agent": await hostile_agent.run(settings),
    }


async def _all(cases: dict[str, Case], runs: int) -> Measured:
    return {name: await _measure(case, runs) for name, case in cases.items()}


async def _measure(case: Case, runs: int) -> tuple[float, float]:
    """Best-of-runs time in ms, and peak traced memory in KiB (one more run, traced)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        await case()
        best = min(best, time.perf_counter() - started)
    tracemalloc.start()
    try:
        await case()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return best * 1000, peak / 1024


def _config_case(data: bytes) -> Case:
    async def case() -> None:
        try:
            for config in load_document(data, "bench").values():
                config_from(config, {})
        except SettingsError:
            pass

    return case


def _document_case(text: str) -> Case:
    async def case() -> None:
        try:
            ResetInfo.parse(text, NODE, "ConfigMap bench/ix-gpu-reset-bench-node")
        except GpuResetError:
            return
        raise AssertionError("a hostile reset document was accepted")

    return case


async def _ixsmi(runs: int) -> Measured:
    workdir = Path(tempfile.mkdtemp(prefix="ixb-ixsmi-"))
    try:
        measured = {}
        for name, script in IXSMI.items():
            path = workdir / name
            path.write_text(f"#!/bin/sh\n{script}\n")
            path.chmod(path.stat().st_mode | stat.S_IEXEC)
            ms, kib = await _measure(_ixsmi_case(str(path)), runs)
            measured[name] = (ms - IXSMI_TIMEOUT * 1000 if name == "child_and_hang" else ms, kib)
        return measured
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _ixsmi_case(path: str) -> Case:
    async def case() -> None:
        with contextlib.suppress(BackendError):
            run_ixsmi_reset(path, ["GPU-bench"], IXSMI_TIMEOUT)

    return case


async def _api(runs: int) -> Measured:
    workdir = Path(tempfile.mkdtemp(prefix="ixb-api-"))
    try:
        async with ApiServerStandIn() as api:
            kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
            kube = await connect(settings_from({"NODE_NAME": NODE}, str(kubeconfig), "bench"))
            try:
                return {name: await _measure(_api_case(api, kube, name), runs) for name in bodies.KINDS}
            finally:
                await kube.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _api_case(api: ApiServerStandIn, kube: Kube, kind: str) -> Case:
    async def case() -> None:
        api.bodies = kind
        try:
            if kind == bodies.ENDLESS_EVENT:
                async for _ in kube.watch(POD, "1", field_selector={"spec.nodeName": NODE}):
                    pass
            elif kind == bodies.ENDLESS:
                await kube.list_pods(field_selector={"spec.nodeName": NODE})
            else:
                await kube.get_object(CONFIG_MAP, "ix-gpu-reset-bench-node", "kube-system")
        except KubeError:
            return
        finally:
            api.bodies = None
        raise AssertionError(f"the API server's {kind} answer was accepted")

    return case
