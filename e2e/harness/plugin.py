"""The plugin under test, driven only through its command line: `ix-device-plugin run` and `ix-device-plugin dra`
as host processes over simulated devices, and the host's device nodes those devices stand for.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .cluster import Cluster
from .host import free_ports, http_get
from .kube import Kubectl, Obj
from .procs import Process
from .waits import until

DEVICE_MAJOR = int(os.environ.get("IX_E2E_DEVICE_MAJOR", "508"))  # an unassigned character major
CONTROL_NODE = "itrctl"
CONTROL_MINOR = 255


def plugin_command() -> list[str]:
    """The installed `ix-device-plugin` next to this interpreter, else `python -m ix_device_plugin`."""
    script = Path(sys.executable).parent / "ix-device-plugin"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ix_device_plugin"]


@dataclass(frozen=True)
class Chip:
    uuid: str
    minor: int
    board: int
    health: tuple[str, ...] = ()
    xids: tuple[int, ...] = ()  # critical XID events the simulated backend reports (each once)


def bi_v150_chips(boards: int = 2) -> list[Chip]:
    """Two chips per BI-V150 board, minors 0..2*boards-1, fixed UUIDs."""
    return [
        Chip(f"GPU-e2e0{board}0{index}-0000-4000-8000-00000000000{2 * board + index}", 2 * board + index, board)
        for board in range(boards)
        for index in range(2)
    ]


def expected_nodes(chips: Sequence[Chip]) -> dict[str, str]:
    """What SHOW_DEVICES prints for a container given chips: their nodes and /dev/itrctl, as hex major:minor."""
    nodes = {f"/dev/iluvatar{chip.minor}": f"{DEVICE_MAJOR:x}:{chip.minor:x}" for chip in chips}
    return nodes | {f"/dev/{CONTROL_NODE}": f"{DEVICE_MAJOR:x}:{CONTROL_MINOR:x}"}


def devices_yaml(chips: Sequence[Chip]) -> str:
    """The simulated backend's devices file for chips (BI-V150 boards)."""
    boards: dict[int, list[dict[str, Any]]] = {}
    for chip in chips:
        boards.setdefault(chip.board, []).append(
            {
                "uuid": chip.uuid,
                "minor": chip.minor,
                "bus_id": f"0000:{0x8A + chip.minor:02x}:00.0",
                "numa_node": 0,
                "health": list(chip.health),
                **({"xids": list(chip.xids)} if chip.xids else {}),
            }
        )
    document = {"boards": [{"product": "BI-V150", "chips": boards[board]} for board in sorted(boards)]}
    return yaml.safe_dump(document, sort_keys=False)


def fake_ixsmi(path: Path, seconds: float = 0) -> Path:
    """An executable standing in for CoreX's ixsmi: each run appends its arguments to `<path>.calls`, takes
    seconds (a slow reset), then appends them to `<path>.done`. As strict as the real one: without privilege
    (CAP_SYS_ADMIN and a writable /sys/bus/pci/drivers) it refuses, exit 1, noting the run in `<path>.refused`."""
    script = (
        "#!/bin/sh\n"
        "caps=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)\n"
        "if [ $(( 0x$caps >> 21 & 1 )) -ne 1 ] || [ ! -w /sys/bus/pci/drivers ]; then\n"
        f'  echo "$@" >> {path}.refused; echo "ixsmi: Permission denied" >&2; exit 1\n'
        "fi\n"
        f'echo "$@" >> {path}.calls\n'
    )
    if seconds:
        script += f"sleep {seconds:g}\n"
    path.write_text(script + f'echo "$@" >> {path}.done\n')
    path.chmod(0o755)
    return path


def ixsmi_calls(path: Path) -> list[str]:
    """The arguments of each run of the fake ixsmi at path, from its start."""
    calls = path.with_name(f"{path.name}.calls")
    return calls.read_text().splitlines() if calls.exists() else []


def ixsmi_done(path: Path) -> list[str]:
    """The arguments of each run of the fake ixsmi at path that has ended."""
    done = path.with_name(f"{path.name}.done")
    return done.read_text().splitlines() if done.exists() else []


def node_health(plugins_dir: Path) -> dict[str, Any]:
    """The node-health record under a kubelet plugins directory, as JSON ({} while there is none)."""
    path = plugins_dir / "iluvatar.com" / "node-health.json"
    return json.loads(path.read_text()) if path.exists() else {}


def node_events(admin: Kubectl, node: str) -> list[Obj]:
    """The agent's Events on the Node (in the namespace default, where a Node's Events go)."""
    selector = f"involvedObject.kind=Node,involvedObject.name={node},source=ix-device-plugin"
    return admin.items("events", "default", "--field-selector", selector)


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.rename(path)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the metric name with exactly these labels in a Prometheus text exposition (None when absent)."""
    for line in text.splitlines():
        if line == name or not line.startswith(name) or line[len(name)] not in " {":
            continue
        head, value = line.rsplit(" ", 1)
        found = dict(re.findall(r'(\w+)="([^"]*)"', head.partition("{")[2]))
        if found == labels:
            return float(value)
    return None


@contextlib.contextmanager
def device_nodes(minors: Sequence[int], dev: Path = Path("/dev")) -> Iterator[list[Path]]:
    """Character devices /dev/iluvatar<minor> and /dev/itrctl (major DEVICE_MAJOR), removed afterwards.

    Refuses to touch a node that exists with another major (a host with real Iluvatar GPUs).
    """
    wanted = {dev / f"iluvatar{minor}": minor for minor in minors} | {dev / CONTROL_NODE: CONTROL_MINOR}
    for path in wanted:
        if path.exists() and os.major(path.stat().st_rdev) != DEVICE_MAJOR:
            raise AssertionError(f"{path} exists and is not a test node: this host seems to have Iluvatar GPUs")
    made = []
    try:
        for path, minor in wanted.items():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(DEVICE_MAJOR, minor))
            made.append(path)
        yield made
    finally:
        for path in made:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


@dataclass
class PluginRun:
    """One `ix-device-plugin` process with its own health port; stopped by `stop`."""

    process: Process
    health_port: int
    files: dict[str, Path] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.health_port}{path}"

    def ready(self) -> bool:
        """/readyz answers 200 (the kubelet accepted the registration)."""
        self.process.check_running()
        try:
            http_get(self.url("/readyz"), timeout=2)
        except OSError:
            return False
        return True

    def wait_ready(self, timeout: float = 60) -> None:
        """Until /readyz answers; a process that does not get there is stopped before the timeout is raised."""
        try:
            until(self.ready, timeout, f"{self.process.name} /readyz", [self.process.log])
        except BaseException:
            self.stop()
            raise

    def metrics(self) -> str:
        return http_get(self.url("/metrics"), timeout=5).decode()

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of the plugin's metric with exactly these labels (None when absent)."""
        return metric_value(self.metrics(), name, **labels)

    def set_config(self, config: dict[str, Any]) -> None:
        """Replace the config file (atomically, as the kubelet swaps a ConfigMap); the plugin reloads it."""
        write_atomically(self.files["config"], yaml.safe_dump(config, sort_keys=False) if config else "flags: {}\n")

    def set_chips(self, chips: Sequence[Chip]) -> None:
        """Replace the simulated devices file (health, presence); re-read at the next health poll."""
        write_atomically(self.files["devices"], devices_yaml(chips))

    def stop(self) -> int | None:
        return self.process.stop()


def start_device_plugin(
    cluster: Cluster,
    workdir: Path,
    name: str,
    config: dict[str, Any] | None = None,
    chips: Sequence[Chip] | None = None,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    features: Path | None = None,
    plugins_dir: Path | None = None,
) -> PluginRun:
    """`ix-device-plugin run` over simulated chips, talking to the cluster's kubelet through its directories;
    its NFD feature file in features (default: the workdir's features.d), its node-health record and reset lock
    under plugins_dir (default: the cluster kubelet's plugins directory, never the host's /var/lib/kubelet)."""
    workdir.mkdir(parents=True, exist_ok=True)
    devices = workdir / "devices.yaml"
    devices.write_text(devices_yaml(chips if chips is not None else bi_v150_chips()))
    config_file = workdir / "ix-config.yaml"
    config_file.write_text(yaml.safe_dump(config or {}, sort_keys=False) if config else "flags: {}\n")
    features = features or workdir / "features.d"
    features.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    argv = [*plugin_command(), "run", "--backend", "simulated", "--simulated-devices", str(devices)]
    argv += ["--config", str(config_file), "--device-plugin-path", str(cluster.device_plugin_dir)]
    argv += ["--cdi-spec-dir", str(cluster.cdi_dir), "--node-feature-dir", str(features)]
    argv += ["--pod-resources-socket", str(cluster.pod_resources_socket), "--telemetry-interval", "1"]
    argv += ["--kubelet-plugins-directory-path", str(plugins_dir or cluster.plugins_dir)]  # as the DRA's
    argv += ["--health-interval", "0.5", "--health-address", f"127.0.0.1:{port}", "--log-level", "debug", *extra]
    environment = dict(os.environ, NODE_NAME=cluster.node_name, POD_NAMESPACE="kube-system", **(env or {}))
    process = Process(name, argv, cluster.logdir / f"{name}.log", env=environment).start()
    files = {"devices": devices, "config": config_file, "workdir": workdir, "features": features}
    return PluginRun(process, port, files)


def start_dra_driver(
    cluster: Cluster,
    workdir: Path,
    name: str,
    kubeconfig: Path,
    chips: Sequence[Chip] | None = None,
    extra: Sequence[str] = (),
    features: Path | None = None,
) -> PluginRun:
    """`ix-device-plugin dra` over simulated chips, registered with the cluster's kubelet; its NFD feature file
    in features (default: the workdir's features.d), its GPU metrics labelled from the kubelet's pod resources."""
    workdir.mkdir(parents=True, exist_ok=True)
    features = features or workdir / "features.d"
    features.mkdir(parents=True, exist_ok=True)
    devices = workdir / "devices.yaml"
    if not devices.exists() or chips is not None:
        devices.write_text(devices_yaml(chips if chips is not None else bi_v150_chips()))
    (port,) = free_ports(1)
    argv = [*plugin_command(), "dra", "--node-name", cluster.node_name, "--kubeconfig", str(kubeconfig)]
    argv += ["--backend", "simulated", "--simulated-devices", str(devices), "--cdi-spec-dir", str(cluster.cdi_dir)]
    argv += ["--kubelet-registrar-directory-path", str(cluster.plugins_registry_dir)]
    argv += ["--kubelet-plugins-directory-path", str(cluster.plugins_dir), "--node-feature-dir", str(features)]
    argv += ["--pod-resources-socket", str(cluster.pod_resources_socket), "--telemetry-interval", "1"]
    argv += ["--health-interval", "0.5", "--health-address", f"127.0.0.1:{port}", "--log-level", "debug", *extra]
    environment = dict(os.environ, POD_NAMESPACE="kube-system")
    environment.pop("KUBECONFIG", None)
    process = Process(name, argv, cluster.logdir / f"{name}.log", env=environment).start()
    return PluginRun(process, port, {"devices": devices, "workdir": workdir, "features": features})
