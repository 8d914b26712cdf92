"""The device plugin loads what a mode does not use only when it is on: its memory stays under its goal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Loaded only once their feature is on (each one measured in docs/performance.md, "Memory by import").
LAZY = (
    "ix_device_plugin.deviceplugin.features.volcano",  # flags.usevolcano
    "ix_device_plugin.deviceplugin.features.volcanotrust",
    "ix_device_plugin.telemetry.collector",  # --telemetry-interval
    "ix_device_plugin.telemetry.sampler",
    "ix_device_plugin.telemetry.holders",
    "ix_device_plugin.nodelabels.service",  # --node-feature-dir
    "ix_device_plugin.core.labels",
    "ix_device_plugin.api.podresources.api_pb2",  # the pod-resources socket, once asked
    "ix_device_plugin.apiserver.watch",  # API access: the return annotation's and Volcano's watches
    "ix_device_plugin.apiserver.objects",
    "difflib",  # only to suggest a name in an error
    "ix_device_plugin.gpureset.sequence",  # a reset: self-healing, flags.reset_gpu, API access (the handshake's record)
    "ix_device_plugin.gpureset.handshake",
    "ix_device_plugin.gpureset.document",
    "ix_device_plugin.healing.events",  # API access: the Node's Events
    "_hashlib",  # OpenSSL's hashes (0.6 MiB): the CDI annotations' strategy at Allocate
)
# The node agent of a device plugin with no API access and nothing to reset, built as `run` builds it.
BUILT_ALONE = """
from pathlib import Path
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.settings.options import Options
root = Path({root!r})
options = Options(plugin_dir=root / "dp", config_path=root / "no-config", dev_root=root, health_address="off",
                  kubelet_plugins_directory_path=root / "plugins", pod_uid="9b8f3c2e-1d4a-4f6b-8e7c-5a2d1f0e9c3b")
daemon = Daemon(options, backend_factory=lambda: SimulatedBackend("BI-V150:2"))
SimulatedBackend("BI-V150:2").discover()  # the simulated chips, as the monitor discovers them
"""


def loaded_after(code: str) -> list[str]:
    """The LAZY modules loaded in a fresh interpreter after running code."""
    probe = f"import sys\n{code}\nprint('\\n'.join(m for m in {LAZY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


def test_the_plugins_entry_and_loop_load_no_feature_that_is_off() -> None:
    # `python -m ix_device_plugin run` imports the command line, then the daemon's loop
    assert loaded_after("import ix_device_plugin.cli, ix_device_plugin.deviceplugin.daemon") == []


def test_the_plugins_node_agent_loads_no_reset_no_events_writer_and_no_hashes_that_nothing_uses(tmp_path: Path) -> None:
    # self-healing is off without API access (auto) and flags.reset_gpu is off: a reload that turns either on
    # loads them then (tests/component/test_reset_on_demand.py)
    assert loaded_after(BUILT_ALONE.format(root=str(tmp_path))) == []


def test_the_node_agent_loads_the_labels_only_when_written(tmp_path: Path) -> None:
    off = "from pathlib import Path\nfrom ix_device_plugin.nodeagent.kit import NodeAgent\n"
    off += "from ix_device_plugin.settings.options import NodeOptions\n"
    off += "NodeAgent._labels(NodeOptions(node_feature_dir=None))"
    assert loaded_after(off) == []
    on = off.replace("node_feature_dir=None", f"node_feature_dir=Path({str(tmp_path)!r})")
    assert "ix_device_plugin.nodelabels.service" in loaded_after(on)
