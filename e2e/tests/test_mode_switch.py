"""A node switched from the device plugin to DRA on the real node, the two pods overlapping as the kubelet runs them
(the DRA driver's pod starts before the plugin's has left): one acts for the node at a time, whatever its mode.

The device plugin, healing, has a chip that needs an operator (XID 64) and resets another (XID 48, a slow fake
ixsmi). The driver starts beside it during that reset and waits on standby: it publishes no ResourceSlice and resets
nothing. Once the plugin stops, the driver takes over: the chip that needs an operator is out of service in its
slice from the first publication on (it knows it from the node-health record alone: its own chips report nothing),
and in all only one pod ever reset a chip, once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.cluster import Cluster
from harness.dra import CHIPS, delete_slices, driver_slices, slice_devices
from harness.kube import Kubectl
from harness.plugin import (
    PluginRun,
    fake_ixsmi,
    ixsmi_calls,
    ixsmi_done,
    node_health,
    start_device_plugin,
    start_dra_driver,
)
from harness.waits import stays, until

DRA_POD = "7c1e9d20-4b3a-4f6e-8d21-5a0b9c3e7f14"
RESET_SECONDS = 8  # the plugin's reset: long enough for the driver to start beside it while it runs
WATCHED = 8.0  # seconds the driver is watched after its takeover for a reset of its own
OPERATOR, RESET = CHIPS[3], CHIPS[0]


def published(admin: Kubectl) -> dict[str, Any]:
    """The devices of the node's slices now ({} while none is published)."""
    return slice_devices(driver_slices(admin))


def never(predicate: Callable[[], Any], seconds: float, what: str) -> None:
    """Fails as soon as predicate holds, looking for seconds."""
    stays(lambda: not predicate(), seconds, what, [], interval=0.2)


def taints(devices: dict[str, Any], chip_minor: int) -> list[Any]:
    return devices.get(f"gpu-{chip_minor}", {}).get("taints") or []


def test_a_switch_from_the_device_plugin_to_dra_keeps_a_chip_out_and_only_one_pod_resets(
    cluster: Cluster, admin: Kubectl, driver_kubeconfig: Path, tmp_path: Path
) -> None:
    delete_slices(admin)
    plugin_ixsmi = fake_ixsmi(tmp_path / "plugin-ixsmi", seconds=RESET_SECONDS)
    driver_ixsmi = fake_ixsmi(tmp_path / "driver-ixsmi")
    api = ["--kubeconfig", str(cluster.kubeconfig("admin")), "--ixsmi-path", str(plugin_ixsmi)]
    plugin = start_device_plugin(cluster, tmp_path / "plugin", "mode-switch-plugin", extra=api)
    driver: PluginRun | None = None
    try:
        plugin.wait_ready()
        plugin.set_chips([replace(c, xids=(64,)) if c == OPERATOR else replace(c, xids=(48,)) if c == RESET else c
                          for c in CHIPS])  # fmt: skip
        until(
            lambda: node_health(cluster.plugins_dir).get("chips", {}).get(OPERATOR.uuid, {}).get("phase") == "operator",
            30, "the record says the chip needs an operator", [plugin.process.log],
        )  # fmt: skip
        until(lambda: ixsmi_calls(plugin_ixsmi), 30, "the plugin's reset began", [plugin.process.log])
        driver = start_dra_driver(
            cluster, tmp_path / "driver", "mode-switch-driver", driver_kubeconfig,
            extra=["--pod-uid", DRA_POD, "--ixsmi-path", str(driver_ixsmi)],
        )  # fmt: skip
        driver.wait_ready(90)  # registered, on standby
        log = driver.process.log_text()
        assert "standby: another pod holds " in log and "node-role.lock (publishing the ResourceSlices" in log
        assert ixsmi_done(plugin_ixsmi) == [], "the reset ended before the driver started beside it: nothing proved"
        assert plugin.metric("ix_device_plugin_acting_for_node") == 1.0
        assert driver.metric("ix_device_plugin_dra_slice_publisher") == 0.0
        assert published(admin) == {}
        until(lambda: ixsmi_done(plugin_ixsmi), 60, "the plugin's reset ended", [plugin.process.log])
        assert published(admin) == {} and ixsmi_calls(driver_ixsmi) == []
        assert plugin.stop() == 0  # the plugin's pod leaves the node
        stopped = time.monotonic()
        first = until(lambda: published(admin), 30, "the driver's slices", [driver.process.log])
        took_over = time.monotonic() - stopped
        assert taints(first, OPERATOR.minor), f"the chip that needs an operator was published in service: {first}"
        assert not taints(first, RESET.minor), f"the chip reset before the switch was published out: {first}"
        never(lambda: ixsmi_calls(driver_ixsmi), WATCHED, "the driver reset a chip after its takeover")
        assert ixsmi_calls(plugin_ixsmi) == ixsmi_done(plugin_ixsmi) == [f"-r -i {RESET.uuid}"]
        assert taints(published(admin), OPERATOR.minor)
        assert node_health(cluster.plugins_dir)["chips"][OPERATOR.uuid]["phase"] == "operator"
        assert driver.metric("ix_device_plugin_dra_slice_publisher") == 1.0
        print(f"mode switch: the driver published {took_over:.2f} s after the plugin stopped")
    finally:
        plugin.stop()
        if driver is not None:
            driver.stop()
        delete_slices(admin)
        (cluster.plugins_dir / "iluvatar.com" / "node-health.json").unlink(missing_ok=True)  # the chip's operator
        admin.delete("configmap", f"ix-gpu-reset-{cluster.node_name}", "kube-system", wait=False)
