"""What the soak's checker reads, and only from outside the agent: the API server (pods, claims, slices, the Node),
the kubelet's device checkpoint, the containers (an exec), the simulated hardware's reset log and /proc.

Imports nothing of the agent (tests/unit/test_soak_schedule.py parses the imports): the kubelet's pod-resources API
would need the agent's generated protobuf modules, so the device plugin's allocations are read from the kubelet's
own device-manager checkpoint, the record the pod-resources API answers from.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checker import Reset

UUID = re.compile(r"GPU-[0-9a-f-]+")
SHOW = (
    "for f in /dev/iluvatar* /dev/itrctl; do [ -e $f ] && stat -c '%n %t:%T %F' $f; done; "
    "env | grep -E '^(IX_|ILUVATAR_)' | sort"
)


@dataclass
class Api:
    """GETs to the API server as the cluster's admin (no kubectl process per read: the soak reads every second)."""

    server: str
    tls: ssl.SSLContext

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.server + path, timeout=10, context=self.tls) as response:
            return json.loads(response.read())

    def items(self, path: str) -> list[dict[str, Any]]:
        return list(self.get(path).get("items") or [])


def certainly_running(pod: dict[str, Any]) -> bool:
    """Its containers run and nothing is stopping them: Running, every container running, no deletion under way."""
    if pod["metadata"].get("deletionTimestamp") or pod.get("status", {}).get("phase") != "Running":
        return False
    statuses = pod["status"].get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


def checkpoint_devices(path: Path) -> dict[str, list[str]]:
    """Pod UID -> the device IDs the kubelet's device manager allocated to it (its checkpoint file)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    found: dict[str, list[str]] = {}
    for entry in (data.get("Data") or {}).get("PodDeviceEntries") or []:
        ids = entry.get("DeviceIDs") or {}
        values = [i for group in ids.values() for i in group] if isinstance(ids, dict) else list(ids)
        found.setdefault(entry.get("PodUID", ""), []).extend(values)
    return found


def claim_devices(claim: dict[str, Any], driver: str) -> list[str]:
    """The device names the claim's allocation gives (this driver's results)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [result["device"] for result in results if result.get("driver") == driver]


def read_resets(path: Path, chip_of: dict[str, int], since: float) -> list[Reset]:
    """Every run of the ixsmi stand-in from its log (`<time> start <pid> <args>`, `<time> end <pid> <rc> <args>`),
    with times relative to since; a run with no end line yet has ended None."""
    started: dict[str, tuple[float, frozenset[int]]] = {}
    resets: list[Reset] = []
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        at, what, pid = float(parts[0]) - since, parts[1], parts[2]
        chips = frozenset(chip_of[u] for u in UUID.findall(line) if u in chip_of)
        if what == "start":
            started[pid] = (at, chips)
        elif what == "end" and pid in started:
            begin, chips = started.pop(pid)
            resets.append(Reset(begin, at, chips, ok=line.split(" ")[3] == "0"))
    resets += [Reset(begin, None, chips) for begin, chips in started.values()]
    return sorted(resets, key=lambda reset: reset.started)


def process_usage(pid: int) -> tuple[int, int] | None:
    """(resident KiB, open files) of a live process, None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        files = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return (int(match.group(1)) if match else 0), files


def shown(output: str) -> tuple[dict[str, str], dict[str, str]]:
    """From SHOW's output: {device path: 'major:minor' (hex)} and {variable: value}."""
    nodes: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in output.strip().splitlines():
        match = re.match(r"^(/dev/\S+) (\w+:\w+) character special file$", line)
        if match:
            nodes[match.group(1)] = match.group(2)
        elif "=" in line:
            key, value = line.split("=", 1)
            env[key] = value
    return nodes, env


def leftovers(
    device_plugin_dir: Path, cdi_dir: Path, plugins_dir: Path, agent_files: list[Path], agent_running: bool
) -> list[str]:
    """What the agent or the workload left behind once the workload is gone: sockets of the agent (while it is
    stopped), per-claim CDI specs and metadata files, checkpoint entries, reset locks still held."""
    found = []
    if not agent_running:
        found += [str(p) for p in device_plugin_dir.glob("*.sock") if p.name != "kubelet.sock"]
        found += [str(p) for p in plugins_dir.glob("gpu.iluvatar.com/*.sock")]
    found += [str(p) for p in cdi_dir.glob("*claim*")]
    found += [str(p) for p in plugins_dir.glob("gpu.iluvatar.com/**/metadata*") if p.is_file()]
    found += [str(p) for p in agent_files if p.exists()]
    for checkpoint in plugins_dir.glob("gpu.iluvatar.com/checkpoint*.json"):
        try:
            claims = json.loads(checkpoint.read_text()).get("claims") or {}
        except (OSError, ValueError, AttributeError):
            continue
        found += [f"{checkpoint}: claim {uid}" for uid in claims]
    return found
