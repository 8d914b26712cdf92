"""Kubernetes API client candidates: import time and resident memory, each in fresh interpreters.

Every sample is a new `python -c` process that first imports `ix_device_plugin.deviceplugin.daemon` (what the plugin
has loaded anyway), then imports the client, then creates a client from a kubeconfig and reads one Node
from the API server stand-in. Import time is measured around the client's import only; VmRSS is read
from /proc/self/status after the daemon's import (the baseline), after the client's import and after
the request. A client that is not installed is left out of the results.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.settings import Settings
from bench.stats import median
from ix_device_plugin.standins.apiserver import ApiServerStandIn

NODE = "bench-node"
SAMPLE_TIMEOUT = 60.0

_PRELUDE = """
import asyncio, json, os, sys, time
def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
import ix_device_plugin.deviceplugin.daemon
baseline = rss_mib()
started = time.perf_counter()
"""

_LIGHTKUBE = """
import lightkube
from lightkube.resources.core_v1 import Node
imported = time.perf_counter()
after_import = rss_mib()
async def request():
    client = lightkube.AsyncClient(lightkube.KubeConfig.from_file(os.environ["KUBECONFIG"]))
    node = await client.get(Node, sys.argv[1])
    await client.close()
    return node.metadata.name
"""

_KUBERNETES_ASYNCIO = """
from kubernetes_asyncio import client, config
imported = time.perf_counter()
after_import = rss_mib()
async def request():
    await config.load_kube_config(config_file=os.environ["KUBECONFIG"])
    async with client.ApiClient() as api:
        node = await client.CoreV1Api(api).read_node(sys.argv[1])
    return node.metadata.name
"""

_EPILOGUE = """
name = asyncio.run(request())
assert name == sys.argv[1], name
print(json.dumps({
    "import_s": imported - started,
    "baseline_rss_mib": baseline,
    "after_import_rss_mib": after_import,
    "after_request_rss_mib": rss_mib(),
}))
"""

CANDIDATES = {"lightkube": _LIGHTKUBE, "kubernetes_asyncio": _KUBERNETES_ASYNCIO}


def installed(candidate: str) -> bool:
    """Whether the client library can be imported here."""
    return importlib.util.find_spec(candidate) is not None


async def _sample(candidate: str, kubeconfig: Path) -> dict[str, float]:
    script = _PRELUDE + CANDIDATES[candidate] + _EPILOGUE
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, NODE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    async with asyncio.timeout(SAMPLE_TIMEOUT):
        out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{candidate} sample failed: {err.decode(errors='replace')[-2000:]}")
    return json.loads(out)


def _summary(samples: list[dict[str, float]]) -> dict[str, float]:
    import_ms = median([sample["import_s"] for sample in samples]) * 1000
    baseline = median([sample["baseline_rss_mib"] for sample in samples])
    after_import = median([sample["after_import_rss_mib"] for sample in samples])
    after_request = median([sample["after_request_rss_mib"] for sample in samples])
    return {
        "runs": len(samples),
        "import_ms": round(import_ms, 1),
        "rss_after_import_mib": round(after_import, 2),
        "rss_after_request_mib": round(after_request, 2),
        "rss_added_by_import_mib": round(after_import - baseline, 2),
        "rss_added_with_request_mib": round(after_request - baseline, 2),
    }


async def run(settings: Settings) -> dict[str, Any]:
    """Median import time and RSS of each installed candidate, and the daemon's own RSS."""
    with tempfile.TemporaryDirectory(prefix="ixb-kube-") as scratch:
        async with ApiServerStandIn() as server:
            server.add_node(NODE)
            kubeconfig = server.write_kubeconfig(Path(scratch) / "kubeconfig")
            samples: dict[str, list[dict[str, float]]] = {name: [] for name in CANDIDATES if installed(name)}
            for _ in range(settings.kubeclient_runs):
                for name, runs in samples.items():  # alternate, so both see the same machine
                    runs.append(await _sample(name, kubeconfig))
    result: dict[str, Any] = {name: _summary(runs) for name, runs in samples.items()}
    every = [sample for runs in samples.values() for sample in runs]
    result["daemon_rss_mib"] = round(median([sample["baseline_rss_mib"] for sample in every]), 2)
    return result
