"""Without its GPU device nodes, the agent says so in one line naming the fix and discovers no GPU.

Real runc containers (podman, the root filesystem an overlay of this machine's): every capability dropped but
mknod, and the host's /dev stood in for by a tmpfs holding device nodes. The container's device cgroup refuses to
open a node whose numbers the runtime did not allow (1:1), as it refuses /dev/iluvatar* in an unprivileged pod the
runtime gave no GPU; it allows 1:3 (/dev/null's), the positive control.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.container_support import COMMAND_TIMEOUT_S, CONTAINERS_CONF, podman_unavailable
from helpers.host_tools import require
from helpers.support import IXML_DOUBLE_CONFIG

from ix_device_plugin.hardware.devnodes import DEVICE_ACCESS_FIX

DENIED, ALLOWED = (1, 1), (1, 3)
ONE_CHIP = 'device uuid=GPU-0 name="Iluvatar BI-V150" minor=0 bus=00000000:8A:00.0 memory=32768\n'
# Made inside the container, where the device cgroup applies; then the agent's own `list`, as the pod would run it.
SCRIPT = """
import os, stat, subprocess, sys
os.makedirs("/host/dev")
for name, (major, minor) in {nodes}.items():
    os.mknod("/host/dev/" + name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
result = subprocess.run([sys.executable, "-m", "ix_device_plugin", "list"], capture_output=True, text=True)
print(result.returncode)
sys.stdout.write(result.stdout)
sys.stderr.write(result.stderr)
"""


@pytest.fixture(scope="module")
def podman() -> Iterator[list[str]]:
    require(podman_unavailable())
    state = Path(tempfile.mkdtemp(prefix="ix-device-access-"))
    (state / "containers.conf").write_text(CONTAINERS_CONF)
    yield [
        "podman",
        "--root", str(state / "root"),
        "--runroot", str(state / "runroot"),
        "--storage-driver", "vfs",
        "--cgroup-manager", "cgroupfs",
        "--runtime", "runc",
    ]  # fmt: skip
    subprocess.run(["rm", "-rf", str(state)], check=False)


@pytest.fixture(scope="module")
def double_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("device-access") / "ixml_double.conf"
    path.write_text(ONE_CHIP)
    return path


def run_list(
    podman: list[str], library: Path, config: Path, nodes: dict[str, tuple[int, int]], backend: str = "ixml"
) -> tuple[int, str, str]:
    """`ix-device-plugin list` on the backend (IXML: the double reporting one chip) in an unprivileged container:
    exit code, stdout, stderr."""
    command = [
        *podman, "run", "--rm", "--network=none", "--cap-drop=ALL", "--cap-add=MKNOD",
        "--tmpfs", "/host:rw,dev,exec",
        "-e", "IX_DEV_ROOT=/host", "-e", f"IX_BACKEND={backend}", "-e", f"IX_IXML_LIBRARY={library}",
        "-e", f"{IXML_DOUBLE_CONFIG}={config}",
        "-e", f"PYTHONPATH={Path(__file__).resolve().parents[2] / 'src'}",
        "--rootfs", "/:O", sys.executable, "-c", SCRIPT.format(nodes=nodes),
    ]  # fmt: skip
    environment = {"CONTAINERS_CONF": command[2].rsplit("/", 1)[0] + "/containers.conf", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False, env=environment
    )
    if result.returncode != 0 and not result.stdout.strip():
        pytest.fail(f"podman could not run the container: {result.stderr.strip()}")
    code, _, stdout = result.stdout.partition("\n")
    return int(code), stdout, result.stderr


def test_a_gpu_node_the_container_may_not_open_is_one_clear_line_and_no_gpu(podman, libs, double_config) -> None:
    code, stdout, stderr = run_list(podman, libs["full"], double_config, {"iluvatar0": DENIED, "itrctl": ALLOWED})
    assert code != 0
    assert stdout == ""  # no GPU listed
    (line,) = [line for line in stderr.splitlines() if "/dev/iluvatar0" in line]
    assert "cannot open /dev/iluvatar0 (Operation not permitted)" in line
    assert DEVICE_ACCESS_FIX in line and "privileged=true" in line
    assert "Traceback" not in stderr


def test_the_control_node_too_is_checked(podman, libs, double_config) -> None:
    code, _, stderr = run_list(podman, libs["full"], double_config, {"iluvatar0": ALLOWED, "itrctl": DENIED})
    assert code != 0
    assert "cannot open /dev/itrctl (Operation not permitted)" in stderr


def test_with_the_nodes_given_the_gpus_are_listed(podman, libs, double_config) -> None:
    code, stdout, stderr = run_list(podman, libs["full"], double_config, {"iluvatar0": ALLOWED, "itrctl": ALLOWED})
    assert code == 0, stderr
    assert "cannot open" not in stderr
    assert "GPU-0" in stdout


# The simulated backend (the end-to-end cluster's) opens the nodes as IXML does, so that a pod without device access
# is the same negative control there.
def test_the_simulated_backend_too_says_so_in_one_line_and_lists_no_gpu(podman, libs, double_config) -> None:
    nodes = {"iluvatar0": DENIED, "itrctl": ALLOWED}
    code, stdout, stderr = run_list(podman, libs["full"], double_config, nodes, backend="simulated")
    assert code != 0
    assert stdout == ""
    (line,) = [line for line in stderr.splitlines() if "/dev/iluvatar0" in line]
    assert "cannot open /dev/iluvatar0 (Operation not permitted)" in line and DEVICE_ACCESS_FIX in line
    assert "Traceback" not in stderr


def test_the_simulated_backend_with_the_nodes_given_lists_its_gpus(podman, libs, double_config) -> None:
    nodes = {"iluvatar0": ALLOWED, "itrctl": ALLOWED}
    code, stdout, stderr = run_list(podman, libs["full"], double_config, nodes, backend="simulated")
    assert code == 0, stderr
    assert "cannot open" not in stderr and "GPU-" in stdout
