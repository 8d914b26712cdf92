"""A reset proven before the chip returns (device plugin mode, simulated chips as strict as ixsmi): ixsmi exiting 0
is not enough. A chip whose XID is reported again after the reset (an ixsmi that lies), or that is not enumerated
again, stays out of service and the attempt counts as failed; a configured diagnostic decides the return, and one
that overruns is killed; and the privileged reset helper's reset is proven the same way."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers.broken_chip import BrokenChip
from helpers.host_tools import cap_sys_admin_missing, require
from helpers.reset_helper_support import chips, live_in_group, running_helper
from helpers.reset_support import CHIP_A, CHIP_B, FAST_HEALING, Ixsmi, node_events
from helpers.support import RESOURCE, config_flags, metric
from helpers.waits import stays, until

from ix_device_plugin.api import HEALTHY, UNHEALTHY
from ix_device_plugin.deviceplugin.daemon import Daemon
from ix_device_plugin.hardware.backend import Backend
from ix_device_plugin.hardware.open import backend_factory
from ix_device_plugin.hardware.resetpath import LocalReset
from ix_device_plugin.hardware.simulated import SimulatedBackend
from ix_device_plugin.settings.options import NodeOptions
from ix_device_plugin.standins.apiserver import ApiServerStandIn
from ix_device_plugin.standins.kubelet import KubeletStandIn, ResourceView

RESETS = "ix_device_plugin_healing_resets_total"
OUTCOMES = "ix_device_plugin_healing_outcomes_total"


@pytest.fixture(autouse=True)
def can_reset() -> None:
    require(cap_sys_admin_missing())  # the simulated reset is as strict as ixsmi -r


def broken_chips(
    path: Path, reset: dict[str, list[str]] | None = None, uuids: tuple[str, str] = (CHIP_A, CHIP_B)
) -> Path:
    """A devices file with two BI-V100 chips, the first with XID 48 pending; reset: its `reset:` behaviours."""
    first, second = uuids
    document: dict[str, object] = {
        "boards": [
            {"product": "BI-V100", "chips": [{"uuid": first, "minor": 0, "xids": [48]}]},
            {"product": "BI-V100", "chips": [{"uuid": second, "minor": 1}]},
        ]
    }
    if reset:
        document["reset"] = reset
    path.write_text(yaml.safe_dump(document))
    return path


def local(devices: Path, ixsmi: Ixsmi) -> Callable[[], Backend]:
    """Simulated chips from devices, reset by this process running the ixsmi stand-in."""
    drivers = ixsmi.sysfs / "bus" / "pci" / "drivers"
    return lambda: SimulatedBackend(str(devices), resetter=LocalReset(ixsmi.path, drivers))


async def never_back_until_an_operator(daemon: Daemon, view: ResourceView, chip: str) -> None:
    """The chip is out of service at every look until its attempts are spent and it needs an operator."""
    seen: set[str] = set()

    def spent() -> bool:
        seen.add(view.devices.get(chip, "gone"))
        return metric(daemon, OUTCOMES, outcome="needs_operator") >= 1

    await until(spent, timeout=20, message="the chip left to an operator")
    assert HEALTHY not in seen, seen


async def test_a_lying_ixsmi_does_not_return_the_chip(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    devices = broken_chips(short_dir / "devices.yaml", {"lie": [CHIP_A]})  # ixsmi exits 0; the chip is not reset
    daemon, view = await broken_chip.started(backend_factory=local(devices, ixsmi))
    await kubelet.wait_for(lambda: view.devices[CHIP_A] == UNHEALTHY, timeout=5)
    await never_back_until_an_operator(daemon, view, CHIP_A)
    assert ixsmi.runs() == [f"-r -i {CHIP_A}"] * FAST_HEALING.attempts  # each attempt ran it, and it exited 0
    assert metric(daemon, RESETS, result="still_unhealthy") == FAST_HEALING.attempts
    assert metric(daemon, RESETS, result="ok") == 0
    attempts = FAST_HEALING.attempts
    await until(lambda: len(node_events(apiserver, "GPUHealingFailed")) == attempts, message="GPUHealingFailed")
    for failed in node_events(apiserver, "GPUHealingFailed"):  # one per attempt
        assert "XID 48 reported again after the reset: it was not cleared" in failed["message"], failed["message"]
    await until(lambda: node_events(apiserver, "GPUNeedsOperator"), message="GPUNeedsOperator")
    [needs] = node_events(apiserver, "GPUNeedsOperator")
    assert f"{FAST_HEALING.attempts} resets failed: XID 48 reported again" in needs["message"], needs["message"]
    assert node_events(apiserver, "GPUHealthy") == []
    await stays(
        lambda: view.devices[CHIP_A] == UNHEALTHY and len(ixsmi.runs()) == FAST_HEALING.attempts,
        for_=FAST_HEALING.backoff_cap + 0.3,
        message="out of service, no further attempt",
    )
    assert view.devices[CHIP_B] == HEALTHY


async def test_a_health_error_the_reset_has_not_cleared_yet_keeps_the_chip_out_until_it_does_its_xids_forgotten(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, short_dir: Path
) -> None:
    """The chip is back as it was and its XID is not reported again, but a health bit still reads set just after
    ixsmi (it clears a moment later): a failed attempt, yet the reset cleared the XID, so once the bit clears the
    chip returns, with no XID left to keep it out."""
    devices = broken_chips(short_dir / "devices.yaml")
    document = yaml.safe_load(devices.read_text())
    document["boards"][0]["chips"][0]["health"] = ["MC"]
    devices.write_text(yaml.safe_dump(document))
    config = config_flags(reset_limit=0)
    daemon, view = await broken_chip.started(backend_factory=local(devices, ixsmi), given=config)
    await until(lambda: metric(daemon, RESETS, result="still_unhealthy") >= 1, timeout=10, message="a failed attempt")
    # Out for the bit alone now: the XID the reset cleared is forgotten.
    await until(lambda: daemon.plan.by_id[CHIP_A].reasons == (f"{CHIP_A}: MC",), timeout=5, message="out for MC alone")
    document["boards"][0]["chips"][0]["health"] = []  # the bit clears after the reset
    devices.write_text(yaml.safe_dump(document))
    await kubelet.wait_for(lambda: view.devices[CHIP_A] == HEALTHY, timeout=10)
    assert daemon.plan.by_id[CHIP_A].healthy


async def test_a_chip_not_enumerated_again_stays_out(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    devices = broken_chips(short_dir / "devices.yaml", {"vanish": [CHIP_A]})
    daemon, view = await broken_chip.started(backend_factory=local(devices, ixsmi))
    await kubelet.wait_for(lambda: view.devices[CHIP_A] == UNHEALTHY, timeout=5)
    await until(lambda: ixsmi.runs() == [f"-r -i {CHIP_A}"], timeout=10, message="one reset")
    await until(lambda: node_events(apiserver, "GPUHealingFailed"), message="GPUHealingFailed")
    [failed] = node_events(apiserver, "GPUHealingFailed")
    assert f"after the reset the node no longer lists {CHIP_A}" in failed["message"], failed["message"]
    assert metric(daemon, RESETS, result="ok") == 0
    await stays(
        lambda: view.devices.get(CHIP_A, "gone") != HEALTHY and len(ixsmi.runs()) == 1,
        for_=FAST_HEALING.backoff_cap + 0.5,
        message="never Healthy, and a chip not there is not reset again",
    )
    assert node_events(apiserver, "GPUHealthy") == [] and view.devices[CHIP_B] == HEALTHY


class Diagnostic:
    """A diagnostic command standing in for an IXDCGM run: records its arguments (a line per run) and its PID, sleeps
    `delay` seconds, and exits with the run's code from `codes` (a line per run; the last repeats)."""

    def __init__(self, directory: Path, codes: str, delay: float = 0) -> None:
        self.calls, self.pid, self.codes = directory / "diag-calls", directory / "diag-pid", directory / "diag-codes"
        self.codes.write_text(codes)
        self.path = directory / "diagnostic"
        self.path.write_text(
            "#!/bin/sh\n"
            f'echo "$@" >> {self.calls}; echo $$ > {self.pid}\n'
            f'n=$(wc -l < {self.calls}); code=$(sed -n "${{n}}p" {self.codes}); '
            f'[ -n "$code" ] || code=$(tail -n 1 {self.codes})\n'
            f'echo "diagnostic run $n"; sleep {delay:g}; exit $code\n'
        )
        self.path.chmod(self.path.stat().st_mode | stat.S_IEXEC)

    def runs(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


async def test_the_diagnostic_decides_the_return(
    broken_chip: BrokenChip, ixsmi: Ixsmi, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    diagnostic = Diagnostic(short_dir, "1\n0\n")  # fails after the first reset, passes after the second
    given = config_flags(reset_diagnostic=f"{diagnostic.path} --chip {{uuid}} --level 2")
    devices = broken_chips(short_dir / "devices.yaml")
    daemon, view = await broken_chip.started(backend_factory=local(devices, ixsmi), given=given)
    seen: set[str] = set()

    def back() -> bool:
        seen.add(view.devices[CHIP_A])
        return view.devices[CHIP_A] == HEALTHY and len(diagnostic.runs()) == 2

    await until(back, timeout=15, message="returned after the second reset's diagnostic")
    assert seen == {UNHEALTHY, HEALTHY} and ixsmi.runs() == [f"-r -i {CHIP_A}"] * 2
    assert diagnostic.runs() == [f"--chip {CHIP_A} --level 2"] * 2  # {uuid} replaced, no shell
    assert metric(daemon, RESETS, result="diagnostic_failed") == 1 and metric(daemon, RESETS, result="ok") == 1
    await until(lambda: node_events(apiserver, "GPUHealthy"), message="GPUHealthy")
    [failed] = node_events(apiserver, "GPUHealingFailed")
    assert "the diagnostic failed" in failed["message"] and "exited with code 1" in failed["message"]
    assert "diagnostic run 1" in failed["message"]  # its words, for the operator
    assert "after a reset" in node_events(apiserver, "GPUHealthy")[0]["message"]


async def test_a_diagnostic_that_overruns_is_killed_and_the_chip_stays_out(
    broken_chip: BrokenChip, ixsmi: Ixsmi, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    diagnostic = Diagnostic(short_dir, "0\n", delay=60)  # it would pass, too late
    given = config_flags(reset_diagnostic=str(diagnostic.path), reset_diagnostic_timeout="0.5")
    devices = broken_chips(short_dir / "devices.yaml")
    daemon, view = await broken_chip.started(backend_factory=local(devices, ixsmi), given=given)
    await until(lambda: metric(daemon, RESETS, result="diagnostic_failed") == 1, timeout=10, message="one overrun")
    group = int(diagnostic.pid.read_text())  # its own session: its PID is its group
    await until(lambda: live_in_group(group) == [], message="the diagnostic and its sleep killed")
    await never_back_until_an_operator(daemon, view, CHIP_A)
    assert metric(daemon, RESETS, result="diagnostic_failed") == FAST_HEALING.attempts
    await until(lambda: len(node_events(apiserver, "GPUHealingFailed")) == FAST_HEALING.attempts)
    for failed in node_events(apiserver, "GPUHealingFailed"):
        assert "did not finish within 0.5s and was killed" in failed["message"], failed["message"]
    await stays(lambda: view.devices[CHIP_A] == UNHEALTHY, for_=0.5, message="out of service")


async def test_a_reset_through_the_reset_helper_is_proven_and_returns_the_chip(
    broken_chip: BrokenChip, kubelet: KubeletStandIn, apiserver: ApiServerStandIn, short_dir: Path
) -> None:
    first, second = chips()  # the helper's chips: the node's
    devices = broken_chips(short_dir / "devices.yaml", uuids=(first, second))
    with running_helper(short_dir / "helper") as helper:
        options = NodeOptions(  # an unprivileged agent would have no other way: here it is told to use the helper
            backend="simulated",
            simulated_devices=str(devices),
            reset_via="helper",
            reset_helper_socket=helper.socket_path,
        )
        daemon = await broken_chip.start(backend_factory=backend_factory(options), reset_via="helper")
        view = await kubelet.wait_registered(RESOURCE, capacity=2)
        await kubelet.wait_for(lambda: view.devices[first] == HEALTHY and helper.ixsmi.runs(), timeout=15)
        assert helper.ixsmi.called_with() == [str(helper.ixsmi.path), "-r", "-i", first]
        await until(lambda: f"reset of {first}: ok after" in helper.logged(), message="the helper's log")
        assert helper.logged().count("reset of ") == 1
    assert metric(daemon, RESETS, result="ok") == 1
    await until(lambda: node_events(apiserver, "GPUHealthy"), message="GPUHealthy")
    assert node_events(apiserver, "GPUHealingFailed") == []
