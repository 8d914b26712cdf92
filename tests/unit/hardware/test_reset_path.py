"""Who runs `ixsmi -r` (hardware/resetpath.py): the way the settings name, what each says is missing before any
reset is tried; and the simulated chips' `reset:` behaviours that stand in for an ixsmi that lies or a chip that
does not come back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.host_tools import cap_sys_admin_missing, require
from helpers.reset_support import CHIP_A, CHIP_B, node_sysfs

from ix_device_plugin.hardware.backend import BackendError, XidEvent
from ix_device_plugin.hardware.resetpath import (
    HelperReset,
    LocalReset,
    NoReset,
    ResetRefusedNow,
    ResetUnavailable,
    resetter_for,
)
from ix_device_plugin.hardware.simulated import RESET_BEHAVIOURS, SimulatedBackend

DRIVERS = Path("/nonexistent/sys/bus/pci/drivers/iluvatar")


@pytest.mark.parametrize(
    ("via", "socket", "expected"),
    [
        ("none", "", NoReset()),
        ("none", "/run/ix/reset.sock", NoReset()),  # none wins over a socket named
        ("helper", "/run/ix/reset.sock", HelperReset("/run/ix/reset.sock")),
        ("auto", "/run/ix/reset.sock", HelperReset("/run/ix/reset.sock")),
        ("auto", "", LocalReset("/usr/local/bin/ixsmi", DRIVERS)),
        ("local", "", LocalReset("/usr/local/bin/ixsmi", DRIVERS)),
        ("local", "/run/ix/reset.sock", LocalReset("/usr/local/bin/ixsmi", DRIVERS)),  # local ignores the socket
    ],
)
def test_the_settings_choose_the_way(via: str, socket: str, expected: object) -> None:
    assert resetter_for(via, socket, "/usr/local/bin/ixsmi", DRIVERS) == expected


def test_helper_without_a_socket_is_no_reset_naming_the_missing_setting() -> None:
    chosen = resetter_for("helper", "", "/usr/local/bin/ixsmi", DRIVERS)
    assert isinstance(chosen, NoReset)
    assert chosen.problem() == "IX_RESET_VIA=helper names no reset helper socket (IX_RESET_HELPER_SOCKET)"


def test_no_reset_says_what_is_missing_and_what_provides_it_and_runs_nothing() -> None:
    why = NoReset().problem()
    assert why is not None
    for needed in ("IX_RESET_VIA=none", "strict: true", "resetHelper.enabled", "privileged: true"):
        assert needed in why, needed
    with pytest.raises(ResetUnavailable) as refused:
        NoReset().run([CHIP_A], 5.0, None)
    assert str(refused.value) == why


def test_a_local_reset_without_the_driver_directory_says_which_and_refuses(tmp_path: Path) -> None:
    drivers = tmp_path / "sys" / "bus" / "pci" / "drivers" / "iluvatar"
    local = LocalReset(None, drivers)
    problem = local.problem()
    assert problem is not None and f"{drivers} does not exist" in problem
    assert "resetHelper.enabled" in problem and "privileged: true" in problem
    with pytest.raises(BackendError, match=f"simulated ixsmi -r -i {CHIP_A}: .*{drivers} does not exist"):
        local.run([CHIP_A], 5.0, None)


def test_a_helper_not_answering_now_is_a_refusal_for_now_not_a_reset_unavailable_for_good(tmp_path: Path) -> None:
    helper = HelperReset(str(tmp_path / "none.sock"))  # its container restarting, say
    assert helper.problem() is None  # no answer that it cannot reset: the reset goes on
    with pytest.raises(ResetRefusedNow, match=r"no reset helper at .*the reset helper is not running"):
        helper.run(["GPU-a"], 1.0, None)


def chips_file(path: Path, reset: dict[str, list[str]] | object, xids: list[int] | None = None) -> Path:
    """A devices file with chips A and B (A's xids as given) and this `reset:` section."""
    chip_a: dict[str, object] = {"uuid": CHIP_A, "minor": 0}
    if xids:
        chip_a["xids"] = xids
    document = {
        "boards": [
            {"product": "BI-V100", "chips": [chip_a]},
            {"product": "BI-V100", "chips": [{"uuid": CHIP_B, "minor": 1}]},
        ],
        "reset": reset,
    }
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def drivers(tmp_path: Path) -> Path:
    require(cap_sys_admin_missing())  # the simulated reset is as strict as ixsmi -r
    return node_sysfs(tmp_path) / "bus" / "pci" / "drivers"


def test_a_lying_reset_reports_the_chips_xids_again(tmp_path: Path, drivers: Path) -> None:
    backend = SimulatedBackend(
        str(chips_file(tmp_path / "d.yaml", {"lie": [CHIP_A]}, xids=[48])), resetter=LocalReset(None, drivers)
    )
    seen: list[XidEvent] = []
    backend.watch_xids(seen.append)
    inventory = backend.discover()
    assert seen == [XidEvent(uuid=CHIP_A, xid=48)]
    backend.health(inventory)
    assert len(seen) == 1  # once each, while nothing was reset
    backend.reset([CHIP_A], 5.0)  # no error: ixsmi "exits 0"
    after = backend.discover()
    assert {chip.uuid for chip in after.chips()} == {CHIP_A, CHIP_B}  # it is there, at its place
    assert seen == [XidEvent(uuid=CHIP_A, xid=48)] * 2  # but its XID is still pending: reported again
    backend.health(after)
    assert len(seen) == 2


def test_an_honest_reset_does_not_report_the_xids_again(tmp_path: Path, drivers: Path) -> None:
    backend = SimulatedBackend(str(chips_file(tmp_path / "d.yaml", {}, xids=[48])), resetter=LocalReset(None, drivers))
    seen: list[XidEvent] = []
    backend.watch_xids(seen.append)
    backend.discover()
    backend.reset([CHIP_A], 5.0)
    backend.health(backend.discover())
    assert seen == [XidEvent(uuid=CHIP_A, xid=48)]


def test_a_vanishing_chip_is_not_enumerated_after_its_reset(tmp_path: Path, drivers: Path) -> None:
    backend = SimulatedBackend(
        str(chips_file(tmp_path / "d.yaml", {"vanish": [CHIP_A]})), resetter=LocalReset(None, drivers)
    )
    backend.watch_xids(lambda event: None)
    inventory = backend.discover()
    assert backend.xids_watched() == {CHIP_A, CHIP_B}
    backend.reset([CHIP_A], 5.0)
    after = backend.discover()
    assert [chip.uuid for chip in after.chips()] == [CHIP_B]
    assert len(after.boards) == 1  # as IXML lists them: its board, with no chip left, is not there either
    health = backend.health(inventory)
    assert not health[CHIP_A].present and health[CHIP_B].present
    assert backend.xids_watched() == {CHIP_B}  # nothing waits for its events any more


def test_the_simulated_reset_refuses_without_the_driver_directory(tmp_path: Path) -> None:
    backend = SimulatedBackend(
        str(chips_file(tmp_path / "d.yaml", {})), resetter=LocalReset(None, tmp_path / "no-sys" / "drivers")
    )
    assert "does not exist" in (backend.reset_problem() or "")
    with pytest.raises(BackendError, match="does not exist"):
        backend.reset([CHIP_A], 5.0)
    assert [chip.uuid for chip in backend.discover().chips()] == [CHIP_A, CHIP_B]  # nothing was done to it


@pytest.mark.parametrize(
    ("section", "says"),
    [
        (
            {"explode": [CHIP_A]},
            "reset: expected a mapping with lists of chip UUIDs under " + ", ".join(RESET_BEHAVIOURS),
        ),
        ([CHIP_A], "reset: expected a mapping with lists of chip UUIDs under fail, new_uuid, lie, vanish"),
        ({"lie": CHIP_A}, "reset.lie: expected a list of chip UUIDs"),
        ({"vanish": [1]}, "reset.vanish: expected a list of chip UUIDs"),
    ],
)
def test_a_malformed_reset_mapping_names_the_allowed_keys(
    tmp_path: Path, drivers: Path, section: object, says: str
) -> None:
    backend = SimulatedBackend(str(chips_file(tmp_path / "d.yaml", section)), resetter=LocalReset(None, drivers))
    with pytest.raises(BackendError) as malformed:
        backend.reset([CHIP_A], 5.0)
    assert says in str(malformed.value)
