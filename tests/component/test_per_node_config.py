"""Per-node configuration: the node label iluvatar.com/device-plugin.config picks a key of the ix-config
ConfigMap, live, through the real client library against the stand-in API server."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import RESOURCE, DaemonFactory
from helpers.waits import until

from ix_device_plugin.apiserver.settings import settings_from
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.healing.operatorreturn import RETURN_ANNOTATION
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.tools.demo import ConfigMapDir

NODE = "gpu-node-1"
LABEL = "iluvatar.com/device-plugin.config"


class NamedConfigMap(ConfigMapDir):
    """A ConfigMap mount with several keys, each a file, swapped together as the kubelet does."""

    def write_keys(self, keys: dict[str, str]) -> None:
        self.write(keys["ix-config"])
        data = self.root / "..data"
        for key, text in keys.items():
            (data / key).write_text(text)
            if not (self.root / key).is_symlink():
                (self.root / key).symlink_to(f"..data/{key}")


@pytest.fixture
def configmap(short_dir: Path) -> NamedConfigMap:
    configmap = NamedConfigMap(short_dir / "ixconfig")
    configmap.write_keys(
        {
            "ix-config": "flags:\n  splitboard: false\n",
            "split": "flags:\n  splitboard: true\n",
            "shared": "sharing:\n  timeSlicing:\n    replicas: 4\n",
        }
    )
    return configmap


async def start_labelled(
    start_daemon: DaemonFactory, apiserver: ApiServerStandIn, configmap: NamedConfigMap, short_dir: Path, key: str
) -> Daemon:
    """A plugin with per-node config on two BI-V150 boards, its node labelled with the ConfigMap key."""
    apiserver.set_node_labels(NODE, {LABEL: key})
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    kube = settings_from({"NODE_NAME": NODE}, str(kubeconfig), "--per-node-config")
    return await start_daemon(
        "BI-V150:2", config_path=configmap.path, config_required=True, per_node_config=True, kube=kube
    )


async def test_the_node_label_picks_the_config_live(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    configmap: NamedConfigMap,
    short_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin.deviceplugin")
    daemon = await start_labelled(start_daemon, apiserver, configmap, short_dir, "split")
    await kubelet.wait_registered(RESOURCE, capacity=4)  # started with the labelled key, not ix-config
    assert daemon.config_path.name == "split"

    apiserver.set_node_labels(NODE, {LABEL: "shared"})
    await kubelet.wait_registered(RESOURCE, capacity=8, timeout=10)

    apiserver.set_node_labels(NODE, {LABEL: "nonexistent"})
    await kubelet.wait_registered(RESOURCE, capacity=2, timeout=10)  # unknown key: back to ix-config
    assert any("no such key" in record.getMessage() for record in caplog.records)

    apiserver.set_node_labels(NODE, {})
    apiserver.set_node_labels(NODE, {LABEL: "split"})
    await kubelet.wait_registered(RESOURCE, capacity=4, timeout=10)

    configmap.write_keys({"ix-config": "flags:\n  splitboard: false\n", "split": "flags: [\n"})
    await until(lambda: any("config change rejected" in r.getMessage() for r in caplog.records), timeout=5)
    assert kubelet.capacity(RESOURCE) == 4  # a bad edit of the selected key keeps the last good config


async def test_an_api_server_that_is_down_at_start_does_not_stop_device_plugging(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    configmap: NamedConfigMap,
    short_dir: Path,
) -> None:
    apiserver.set_node_labels(NODE, {LABEL: "split"})
    apiserver.unavailable = True
    kube = settings_from({"NODE_NAME": NODE}, str(apiserver.write_kubeconfig(short_dir / "kc")), "--per-node-config")
    await start_daemon(
        "BI-V150:2",
        config_path=configmap.path,
        config_required=True,
        per_node_config=True,
        kube=kube,
        label_wait=0.5,
    )
    await kubelet.wait_registered(RESOURCE, capacity=2)  # ix-config while the API server is down
    apiserver.unavailable = False
    await kubelet.wait_registered(RESOURCE, capacity=4, timeout=15)  # the label, once it answers


def test_per_node_config_without_node_name_is_a_one_line_error() -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"NODE_NAME", "KUBECONFIG"} and not k.startswith("IX_")}
    result = subprocess.run(
        [sys.executable, "-m", "ix_device_plugin", "run", "--per-node-config", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 2
    assert "--per-node-config needs NODE_NAME" in result.stderr
    assert "Traceback" not in result.stderr


async def test_list_says_which_key_is_in_force_and_why(
    apiserver: ApiServerStandIn, configmap: NamedConfigMap, short_dir: Path
) -> None:
    apiserver.set_node_labels(NODE, {LABEL: "shared"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("IX_")}
    env |= {"NODE_NAME": NODE, "KUBECONFIG": str(apiserver.write_kubeconfig(short_dir / "kc"))}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "ix_device_plugin", "list", "--backend", "simulated"),
        *("--config", str(configmap.path), "--per-node-config", "true"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    text = out.decode()
    assert f"Configuration from: {configmap.root / 'shared'} (node label {LABEL}=shared)" in text
    assert "iluvatar.com/gpu: 8" in text


async def test_a_label_naming_an_invalid_config_falls_back_at_start_and_takes_the_fix_live(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    configmap: NamedConfigMap,
    short_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    configmap.write_keys(
        {
            "ix-config": "flags:\n  splitboard: false\n",
            "split": "flags:\n  splitboard: ture\n",  # a typo an editor of the ConfigMap made
            "shared": "sharing:\n  timeSlicing:\n    replicas: 4\n",
        }
    )
    apiserver.set_node_labels(NODE, {LABEL: "split"})
    kube = settings_from({"NODE_NAME": NODE}, str(apiserver.write_kubeconfig(short_dir / "kubeconfig")), "test")
    await start_daemon("BI-V150:2", config_path=configmap.path, config_required=True, per_node_config=True, kube=kube)
    await kubelet.wait_registered(RESOURCE, capacity=2)  # ix-config, not a crash loop
    assert any("flags.splitboard: expected true or false, got 'ture'" in r.getMessage() for r in caplog.records)
    assert any("starting with" in r.getMessage() and "until it is fixed" in r.getMessage() for r in caplog.records)
    configmap.write_keys(
        {
            "ix-config": "flags:\n  splitboard: false\n",
            "split": "flags:\n  splitboard: true\n",
            "shared": "sharing:\n  timeSlicing:\n    replicas: 4\n",
        }
    )
    await kubelet.wait_registered(RESOURCE, capacity=4, timeout=10)  # the fixed key, picked up live


async def test_the_node_is_watched_once_for_its_label_and_the_operators_annotation(
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    apiserver: ApiServerStandIn,
    configmap: NamedConfigMap,
    short_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ix_device_plugin.healing")
    daemon = await start_labelled(start_daemon, apiserver, configmap, short_dir, "split")
    await kubelet.wait_registered(RESOURCE, capacity=4)
    assert daemon.node.healing.requests is not None  # self-healing follows gpu.return: through the label's watch
    await apiserver.watching("nodes")
    node = apiserver.get("nodes", NODE)
    assert node is not None
    node["metadata"].setdefault("annotations", {})[RETURN_ANNOTATION] = "0"
    apiserver.put("nodes", node)
    await until(lambda: any("an operator asks to return it" in r.getMessage() for r in caplog.records), timeout=5)
    node_watches = [r for r in apiserver.requests if r.query.get("watch") == "true" and r.path == "/api/v1/nodes"]
    assert len(node_watches) == 1, [r.query for r in node_watches]
