"""Self-healing where no reset can work (device plugin mode, over the C double): the chip goes to an operator with
one GPUResetUnavailable Event naming what is missing and the value that provides it; nothing is asked of the other
IXML users (no handshake), ixsmi never runs, and the chip stays out of service until an operator, who reset it by
hand, returns it. What the node knows outlives a restart: the chip is still out, and it is not said twice."""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers.broken_chip import BrokenChip
from helpers.reset_support import NODE, Ixsmi, node_events
from helpers.support import RESOURCE, metric
from helpers.waits import stays, until
from test_health_record import recorded

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.hardware.open import BackendFactory, backend_factory
from ix_device_plugin.healing.operatorreturn import RETURN_ANNOTATION
from ix_device_plugin.settings.options import NodeOptions
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn, ResourceView

CHIP = "GPU-x1"
UNAVAILABLE = "GPUResetUnavailable"


def double_with(broken_chip: BrokenChip, via: str, sysfs: Path) -> BackendFactory:
    """The IXML backend over the C double as `--backend ixml --reset-via <via> --sysfs-root <sysfs>` builds it."""
    options = NodeOptions(
        backend="ixml",
        ixml_library=str(broken_chip.libs()["full"]),
        dev_root=broken_chip.short_dir,
        sysfs_root=sysfs,
        ixsmi_path=broken_chip.ixsmi.path,
        reset_via=via,
    )
    return backend_factory(options)


def handshake_writes(apiserver: ApiServerStandIn) -> list[str]:
    """Every write to a ConfigMap (the handshake with the other IXML users is the agent's only one)."""
    return [f"{r.method} {r.path}" for r in apiserver.requests if "/configmaps" in r.path and r.method != "GET"]


async def left_to_an_operator(broken_chip: BrokenChip) -> tuple[ResourceView, dict]:
    """XID 48 on GPU 1, a free chip a reset would clear: it is out, with its one GPUResetUnavailable Event, and
    stays out with nothing tried."""
    kubelet, apiserver, ixsmi = broken_chip.kubelet, broken_chip.apiserver, broken_chip.ixsmi
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    broken_chip.breaks(1, 48)
    await kubelet.wait_for(lambda: view.devices[CHIP] == UNHEALTHY, timeout=5)
    await until(lambda: node_events(apiserver, UNAVAILABLE), timeout=5, message="a GPUResetUnavailable Event")

    def nothing_tried() -> bool:
        return ixsmi.runs() == [] and view.devices[CHIP] == UNHEALTHY and handshake_writes(apiserver) == []

    await stays(nothing_tried, for_=1.0, message="out of service, no ixsmi, no handshake")
    [event] = node_events(apiserver, UNAVAILABLE)
    assert event["type"] == "Warning" and event["count"] == 1
    for absent in ("GPUNeedsOperator", "GPUHealingFailed", "GPUHealingReset", "GPUHealingWaiting"):
        assert node_events(apiserver, absent) == [], absent
    assert view.devices["GPU-x0"] == HEALTHY  # the other chip is untouched
    return view, event


async def test_with_no_reset_path_the_chip_is_left_to_an_operator_with_one_event_and_returned_by_hand(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    factory = double_with(broken_chip, "none", ixsmi.sysfs)  # ixsmi could run: the settings say none
    daemon = await broken_chip.start(backend_factory=factory, reset_via="none")
    view, event = await left_to_an_operator(broken_chip)
    message = event["message"]
    assert message.startswith(f"GPU 1 ({CHIP}) cannot be reset here: no reset path is given to the agent")
    for says in ("IX_RESET_VIA=none", "strict: true", "resetHelper.enabled", "privileged: true"):
        assert says in message, says
    assert f"ixsmi -r -i {CHIP}" in message  # by hand
    assert f"kubectl annotate --overwrite node {NODE} {RETURN_ANNOTATION}={CHIP}" in message
    assert metric(daemon, "ix_device_plugin_healing_outcomes_total", outcome="needs_operator") == 1
    assert metric(daemon, "ix_device_plugin_healing_resets_total", result="ok") == 0
    entry = recorded(short_dir, CHIP)
    assert entry["phase"] == "operator" and entry["note"].startswith("cannot be reset here: ")

    broken_chip.returned_by_an_operator(CHIP)  # they reset it by hand: its XID is forgotten, and no ixsmi runs
    await kubelet.wait_for(lambda: view.devices[CHIP] == HEALTHY, timeout=10)
    assert ixsmi.runs() == [] and handshake_writes(apiserver) == []
    await until(lambda: node_events(apiserver, "GPUHealthy"), timeout=5, message="a GPUHealthy Event")
    assert len(node_events(apiserver, UNAVAILABLE)) == 1
    assert metric(daemon, "ix_device_plugin_healing_resets_total", result="ok") == 0
    await until(lambda: recorded(short_dir, CHIP) == {}, timeout=5, message="nothing left to remember of it")

    broken_chip.breaks(1, 48)  # a later fault is left to an operator again (its Event's repeat: a count, later)
    await kubelet.wait_for(lambda: view.devices[CHIP] == UNHEALTHY, timeout=5)
    await until(lambda: metric(daemon, "ix_device_plugin_healing_outcomes_total", outcome="needs_operator") == 2)
    await stays(lambda: ixsmi.runs() == [] and view.devices[CHIP] == UNHEALTHY, for_=0.5, message="not reset")


async def test_a_local_reset_without_the_pci_driver_directory_names_it(
    broken_chip: BrokenChip, ixsmi: Ixsmi, short_dir: Path
) -> None:
    bare = short_dir / "bare-sys"  # a /sys without Iluvatar's driver directory, which ixsmi -r writes
    bare.mkdir()
    factory = double_with(broken_chip, "auto", bare)  # auto with no helper socket: local
    await broken_chip.start(backend_factory=factory)
    _, event = await left_to_an_operator(broken_chip)
    drivers = bare / "bus" / "pci" / "drivers" / "iluvatar"
    assert f"cannot be reset here: {drivers} does not exist" in event["message"]
    assert "resetHelper.enabled" in event["message"] and "privileged: true" in event["message"]


async def test_a_restart_keeps_the_chip_out_without_saying_it_again_and_it_can_be_returned_then(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, short_dir: Path
) -> None:

    async def start() -> Daemon:
        factory = double_with(broken_chip, "none", ixsmi.sysfs)
        return await broken_chip.start(backend_factory=factory, reset_via="none")

    first = await start()
    await left_to_an_operator(broken_chip)
    await until(lambda: recorded(short_dir, CHIP).get("phase") == "operator", timeout=5)
    await first.shutdown()
    shutil.rmtree(short_dir / "dev")  # made again by the next start

    await start()
    view = await kubelet.wait_registered(RESOURCE, capacity=2)
    await kubelet.wait_for(lambda: view.devices[CHIP] == UNHEALTHY, timeout=5)  # the record's XID keeps it out

    def said_once() -> bool:
        return [e["count"] for e in node_events(apiserver, UNAVAILABLE)] == [1] and view.devices[CHIP] == UNHEALTHY

    await stays(said_once, for_=1.5, message="still out, its GPUResetUnavailable not said again")
    assert node_events(apiserver, "GPUNeedsOperator") == [] and ixsmi.runs() == []

    broken_chip.returned_by_an_operator(CHIP)  # the restored chip is still one no reset can help: returned by hand
    await kubelet.wait_for(lambda: view.devices[CHIP] == HEALTHY, timeout=10)
    assert ixsmi.runs() == [] and handshake_writes(apiserver) == []
