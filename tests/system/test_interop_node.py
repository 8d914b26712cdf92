"""The plugin against a kubelet stand-in written in Node.js (tests/interop/node).

The stand-in has its own copy of the upstream v1beta1 proto and speaks only that: it serves Registration,
dials the plugin back, lists the devices, asks for a preferred allocation of one device and allocates it.
Its report must agree with the plugin's own `list --output json` for the same flags.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.host_tools import missing
from helpers.support import TESTS_DIR
from helpers.waits import until_sync

NODE_DIR = TESTS_DIR / "interop" / "node"
SIMULATED = ["--backend", "simulated", "--simulated-devices", "BI-V150:2"]
ENV_NAMES = (
    ("IX_VISIBLE_DEVICES", "IX_REPLICA_DEVICES"),
    ("ILUVATAR_COREX_VISIBLE_DEVICES", "ILUVATAR_COREX_REPLICA_DEVICES"),
)
# npm error codes meaning the registry could not be reached (as opposed to a broken package.json or lockfile).
NETWORK_ERRORS = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ECONNRESET",
    "ETIMEDOUT",
    "ENETUNREACH",
    "EHOSTUNREACH",
    "CERT_",
    "UNABLE_TO_",
    "SELF_SIGNED",
    "network",
)
CASES = [
    pytest.param([], 2, id="defaults"),
    pytest.param(["--splitboard"], 4, id="splitboard"),
    pytest.param(["--replicas", "4"], 8, id="replicas"),
    pytest.param(["--replicas", "4", "--splitboard"], 16, id="replicas-splitboard"),
]


def _modules_installed(node: str) -> bool:
    probe = "require('@grpc/grpc-js'); require('@grpc/proto-loader')"
    result = subprocess.run([node, "-e", probe], cwd=NODE_DIR, capture_output=True, timeout=30, check=False)
    return result.returncode == 0


@pytest.fixture(scope="module")
def node() -> str:
    """The node executable, with the stand-in's dependencies installed (npm ci when they are missing). .ci/run
    installs neither Node.js nor the stand-in's modules: without them the test is skipped, in CI too."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing("the Node.js interop test needs `node` and `npm` on PATH", ci_provides=False)
    if not _modules_installed(node):
        command = [npm, "ci", "--no-audit", "--no-fund"]
        try:
            result = subprocess.run(command, cwd=NODE_DIR, capture_output=True, text=True, timeout=300, check=False)
        except subprocess.TimeoutExpired:
            missing(
                "`npm ci` for the Node.js interop test did not finish within 300 s (registry unreachable?)",
                ci_provides=False,
            )
        output = result.stdout + result.stderr
        if result.returncode != 0:
            if any(code in output for code in NETWORK_ERRORS):
                summary = [line for line in output.splitlines() if "error code" in line or "FetchError" in line]
                reason = f"`npm ci` could not reach the npm registry: {'; '.join(summary[:2]) or output[-500:]}"
                missing(reason, ci_provides=False)
            pytest.fail(f"`npm ci` in {NODE_DIR} failed with exit code {result.returncode}:\n{output[-4000:]}")
        assert _modules_installed(node), f"`npm ci` succeeded but the modules do not load:\n{output[-2000:]}"
    return node


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    path = tempfile.mkdtemp(prefix="ixn-", dir="/tmp")  # short: unix socket paths are at most 107 bytes
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _wait_for_socket(path: Path, process: subprocess.Popen[str], timeout: float = 10.0) -> None:
    until_sync(lambda: path.exists() or process.poll() is not None, timeout, message=f"the Node.js stand-in's {path}")
    if not path.exists():
        stderr = process.stderr.read() if process.stderr else ""
        pytest.fail(f"the Node.js stand-in exited with {process.returncode} before listening:\n{stderr}")


def _run_round_trip(node: str, directory: Path, flags: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (the stand-in's report, the plugin's `list --output json`) for one set of config flags."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name in list(env):  # only the flags given here may configure the plugin
        if name.startswith("IX_"):
            del env[name]
    plugin_log = directory / "plugin.log"
    lister = subprocess.Popen(
        [sys.executable, "-m", "ix_device_plugin", "list", *SIMULATED, "--output", "json", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    kubelet = subprocess.Popen(
        [node, str(NODE_DIR / "kubelet.js"), str(directory), "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    plugin: subprocess.Popen[str] | None = None
    try:
        _wait_for_socket(directory / "kubelet.sock", kubelet)
        with plugin_log.open("w") as log:
            plugin = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ix_device_plugin",
                    "run",
                    *SIMULATED,
                    "--device-plugin-path",
                    str(directory),
                    "--kubelet-plugins-directory-path",
                    str(directory.parent / "plugins"),
                    "--health-address",
                    "off",
                    "--cdi-spec-dir",
                    "off",
                    "--node-feature-dir",
                    "off",
                    *flags,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        try:
            out, err = kubelet.communicate(timeout=25)
        except subprocess.TimeoutExpired:
            kubelet.kill()
            out, err = kubelet.communicate()
        plugin_alive = plugin.poll() is None
        list_out, list_err = lister.communicate(timeout=20)
    finally:
        for process in (kubelet, plugin, lister):
            if process is not None:
                _stop(process)
    context = f"stand-in stderr:\n{err}\nplugin log:\n{plugin_log.read_text()}"
    assert kubelet.returncode == 0, f"the Node.js stand-in exited with {kubelet.returncode}\n{context}"
    assert plugin_alive, f"the plugin exited early\n{context}"
    assert lister.returncode == 0, f"`ix_device_plugin list` failed:\n{list_err}"
    lines = out.splitlines()
    assert len(lines) == 1, f"expected one JSON line from the stand-in, got:\n{out}\n{context}"
    return json.loads(lines[0]), json.loads(list_out)


@pytest.mark.parametrize(("flags", "capacity"), CASES)
def test_node_kubelet_round_trip(node: str, plugin_dir: Path, flags: list[str], capacity: int) -> None:
    report, listing = _run_round_trip(node, plugin_dir, flags)

    register = report["register"]
    assert register["version"] == "v1beta1"
    assert register["endpoint"] == "iluvatar-gpu.sock"
    assert register["resource_name"] == "iluvatar.com/gpu" == listing["resource_name"]
    assert register["options"]["get_preferred_allocation_available"] is True
    assert report["options"] == register["options"]

    assert report["capacity"] == capacity == listing["capacity"]
    assert report["healthy"] == capacity
    assert all(device["health"] == "Healthy" for device in report["devices"]), report["devices"]
    listed = {device["id"]: device for device in listing["devices"]}
    assert len(report["device_ids"]) == len(set(report["device_ids"])) == capacity
    assert sorted(report["device_ids"]) == sorted(listed)
    for device in report["devices"]:
        assert sorted(device["numa_nodes"]) == sorted(listed[device["id"]]["numa_nodes"]), device

    preferred = report["preferred"]
    assert isinstance(preferred, list) and len(preferred) == 1, preferred
    (device_id,) = preferred
    assert device_id in listed
    assert report["allocated_ids"] == preferred
    if "--replicas" in flags:
        uuid, _, replica = device_id.partition("::")
        assert replica.isdigit() and 0 <= int(replica) < 4, device_id
    else:
        uuid = device_id
        assert "::" not in device_id

    chips = listed[device_id]["chips"]
    assert chips[0] == uuid, (device_id, chips)
    assert len(chips) == (1 if "--splitboard" in flags else 2)
    minors = {chip["uuid"]: chip["minor"] for board in listing["boards"] for chip in board["chips"]}
    allocation = report["allocation"]
    expected_paths = {f"/dev/iluvatar{minors[chip]}" for chip in chips} | set(listing["control_nodes"])
    specs = allocation["devices"]
    assert {spec["host_path"] for spec in specs} == expected_paths, specs
    assert len(specs) == len(expected_paths), specs
    for spec in specs:
        assert spec["container_path"] == spec["host_path"], spec
        assert spec["permissions"] == "rw", spec

    envs = allocation["envs"]
    for visible, replicas in ENV_NAMES:
        assert envs[visible] == ",".join(chips), envs
        assert envs[replicas] == device_id, envs
