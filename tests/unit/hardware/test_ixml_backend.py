"""The IXML backend against a compiled stand-in for libixml.so (tests/ixml_double)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.support import IXML_DOUBLE_CONFIG as CONFIG_ENV
from helpers.support import make_dev_root

from ix_device_plugin.core.inventory import (
    TOPOLOGY_HOSTBRIDGE,
    TOPOLOGY_NODE,
    TOPOLOGY_SINGLE,
    TOPOLOGY_SYSTEM,
    Board,
    Chip,
    ChipStatus,
    Inventory,
    carry_missing,
    link_key,
)
from ix_device_plugin.core.plan import plan
from ix_device_plugin.hardware.backend import BackendError
from ix_device_plugin.hardware.devnodes import CONTROL_NODE, check_device_nodes
from ix_device_plugin.hardware.ixml import IxmlBackend, NoDevicesError
from ix_device_plugin.hardware.ixml.devices import normalize_bus_id, placeholder_uuid, read_numa_node
from ix_device_plugin.hardware.ixml.library import find_library, load_library
from ix_device_plugin.settings.config import Config

LOGGER = "ix_device_plugin.hardware.ixml"  # the package's modules log under it

# Two BI-V150 cards, listed out of board order so grouping has to use positions.
TWO_BI_V150 = """
driver=4.1.0
link=0,1,10
link=2,3,10
link=0,2,30
link=0,3,30
link=1,2,40
device uuid=GPU-b0-c1 name="Iluvatar BI-V150" minor=1 bus=00000000:8B:00.0 memory=32768 board=B0 position=1
device uuid=GPU-b0-c0 name="Iluvatar BI-V150" minor=0 bus=00000000:8A:00.0 memory=32768 board=B0 position=0
device uuid=GPU-b1-c0 name="Iluvatar BI-V150" minor=2 bus=00000000:CA:00.0 memory=32768 board=B1 position=0
device uuid=GPU-b1-c1 name="Iluvatar BI-V150" minor=3 bus=00000000:CB:00.0 memory=32768 board=B1 position=1
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Writes the double's device file; call again to change what the library reports."""
    path = tmp_path / "ixml_double.conf"
    monkeypatch.setenv(CONFIG_ENV, str(path))

    def write(text: str) -> Path:
        path.write_text(text)
        return path

    return write


def make_sysfs(root: Path, numa: dict[str, str]) -> Path:
    for bus_id, node in numa.items():
        device = root / "bus" / "pci" / "devices" / bus_id
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{node}\n")
    return root


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    return make_dev_root(tmp_path / "root", [0, 1, 2, 3])


@pytest.fixture
def backend_for(libs, dev_root, tmp_path):
    """Builds backends over a double variant and closes them after the test."""
    made: list[IxmlBackend] = []

    def build(variant: str = "full", *, root: Path | None = None, sysfs: Path | None = None) -> IxmlBackend:
        backend = IxmlBackend(str(libs[variant]), dev_root=root or dev_root, sysfs_root=sysfs or tmp_path / "no-sysfs")
        made.append(backend)
        return backend

    yield build
    for backend in made:
        backend.close()


@pytest.fixture
def warnings_logged():
    """Warning records of the IXML module, caught on its own logger whatever logging setup ran before."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger(LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def chip_uuids(inventory: Inventory) -> list[list[str]]:
    return [[chip.uuid for chip in board.chips] for board in inventory.boards]


def test_two_bi_v150_cards_are_two_boards_of_two_chips(config, backend_for, tmp_path):
    config(TWO_BI_V150)
    sysfs = make_sysfs(
        tmp_path / "sys",
        {"0000:8a:00.0": "0", "0000:8b:00.0": "0", "0000:ca:00.0": "1", "0000:cb:00.0": "-1"},
    )

    inventory = backend_for(sysfs=sysfs).discover()

    assert chip_uuids(inventory) == [["GPU-b0-c0", "GPU-b0-c1"], ["GPU-b1-c0", "GPU-b1-c1"]]
    assert [board.uuid for board in inventory.boards] == ["GPU-b0-c0", "GPU-b1-c0"]
    assert inventory.boards[0] == Board(
        product="Iluvatar BI-V150",
        chips=(
            Chip("GPU-b0-c0", 0, "Iluvatar BI-V150", "0000:8a:00.0", 0, 32768),
            Chip("GPU-b0-c1", 1, "Iluvatar BI-V150", "0000:8b:00.0", 0, 32768),
        ),
    )
    assert [(chip.minor, chip.numa_node) for chip in inventory.boards[1].chips] == [(2, 1), (3, None)]
    assert inventory.driver_version == "4.1.0"
    assert inventory.control_nodes == (CONTROL_NODE,)
    assert all(status == ChipStatus() for status in inventory.statuses().values())


def test_topology_levels_for_every_pair(config, backend_for):
    config(TWO_BI_V150)

    inventory = backend_for().discover()

    assert inventory.links == {
        link_key("GPU-b0-c1", "GPU-b0-c0"): TOPOLOGY_SINGLE,
        link_key("GPU-b1-c0", "GPU-b1-c1"): TOPOLOGY_SINGLE,
        link_key("GPU-b0-c1", "GPU-b1-c0"): TOPOLOGY_HOSTBRIDGE,
        link_key("GPU-b0-c1", "GPU-b1-c1"): TOPOLOGY_HOSTBRIDGE,
        link_key("GPU-b0-c0", "GPU-b1-c0"): TOPOLOGY_NODE,
        link_key("GPU-b0-c0", "GPU-b1-c1"): TOPOLOGY_SYSTEM,
    }
    assert inventory.link("GPU-b1-c1", "GPU-b1-c0") == TOPOLOGY_SINGLE


def test_no_topology_call_leaves_links_unknown(config, backend_for):
    config(TWO_BI_V150)

    inventory = backend_for("no_topology").discover()

    assert inventory.links == {}
    assert inventory.chip_count() == 4


def test_health_mask_names_the_errors_and_is_reread(config, backend_for):
    path = config(TWO_BI_V150.replace("minor=2 ", "minor=2 health=0x14 "))
    backend = backend_for()

    inventory = backend.discover()

    sick = inventory.statuses()["GPU-b1-c0"]
    assert sick.errors == frozenset({"ECC", "OverTemp"})
    assert sick.reasons(frozenset()) == ("ECC", "OverTemp")
    assert inventory.statuses()["GPU-b1-c1"] == ChipStatus()

    path.write_text(TWO_BI_V150.replace("minor=3 ", "minor=3 health=0x40 "))
    statuses = backend.health(inventory)

    assert statuses["GPU-b1-c0"] == ChipStatus()
    assert statuses["GPU-b1-c1"].errors == frozenset({"PCIE"})
    assert set(statuses) == {"GPU-b0-c0", "GPU-b0-c1", "GPU-b1-c0", "GPU-b1-c1"}


def test_old_library_without_extensions(config, backend_for, warnings_logged):
    config(TWO_BI_V150.replace("minor=1 ", "minor=1 health=0x10 "))
    backend = backend_for("old")

    inventory = backend.discover()
    statuses = backend.health(inventory)
    backend.discover()

    assert chip_uuids(inventory) == [["GPU-b0-c1"], ["GPU-b0-c0"], ["GPU-b1-c0"], ["GPU-b1-c1"]]
    assert not any(board.membership_known for board in inventory.boards)
    assert all(status == ChipStatus() for status in statuses.values())
    assert [chip.bus_id for chip in inventory.chips()] == [
        "0000:8b:00.0",
        "0000:8a:00.0",
        "0000:ca:00.0",
        "0000:cb:00.0",
    ]
    unavailable = [r for r in warnings_logged if "health checks are unavailable" in r.getMessage()]
    assert len(unavailable) == 1


def test_without_board_positions_every_bi_v150_chip_is_advertised_healthy(config, backend_for):
    config(TWO_BI_V150)

    inventory = carry_missing(Inventory(), backend_for("old").discover())
    devices = plan(inventory, Config()).devices

    assert sorted(device.id for device in devices) == ["GPU-b0-c0", "GPU-b0-c1", "GPU-b1-c0", "GPU-b1-c1"]
    assert all(device.healthy for device in devices)


def test_not_supported_answers_mean_no_boards_and_no_health(config, backend_for, warnings_logged):
    config(
        TWO_BI_V150.replace("minor=0 ", "minor=0 unsupported=board,health ").replace(
            "position=1\n", "position=1 unsupported=board,health\n"
        )
    )

    inventory = backend_for().discover()

    # Only GPU-b1-c0 still answers; its board partner cannot say where it sits.
    assert chip_uuids(inventory) == [["GPU-b0-c1"], ["GPU-b0-c0"], ["GPU-b1-c0"], ["GPU-b1-c1"]]
    assert [board.membership_known for board in inventory.boards] == [False, False, True, False]
    assert all(status == ChipStatus() for status in inventory.statuses().values())
    # As Iluvatar's plugin: the placed chip without its partner is short, the unplaced ones are single boards.
    healthy = {device.id: device.healthy for device in plan(inventory, Config()).devices}
    assert healthy == {"GPU-b0-c1": True, "GPU-b0-c0": True, "GPU-b1-c0": False, "GPU-b1-c1": True}
    assert sum("health checks are unavailable" in r.getMessage() for r in warnings_logged) == 1


def on_every_device(text: str, keys: str) -> str:
    return "\n".join(f"{line} {keys}" if line.startswith("device ") else line for line in text.splitlines())


def test_health_not_supported_on_every_chip_leaves_the_node_usable(config, backend_for, dev_root, warnings_logged):
    # Iluvatar's 4.4.0 marks every chip Unhealthy here (pkg/dpm/device.go checkHealth: any error from
    # DeviceGetHealth), so the node offers no GPU; ours counts a chip healthy while its other calls and its
    # device node work (README, "The IXML backend"), and says once that health is unmonitored.
    path = config(on_every_device(TWO_BI_V150, "unsupported=health"))
    backend = backend_for()

    inventory = backend.discover()
    statuses = [backend.health(inventory) for _ in range(2)]

    assert all(board.membership_known for board in inventory.boards)
    assert all(status == ChipStatus() for status in inventory.statuses().values())
    assert all(status == ChipStatus() for polled in statuses for status in polled.values())
    assert [device.healthy for device in plan(inventory, Config()).devices] == [True, True]
    assert [device.healthy for device in plan(inventory, Config(splitboard=True)).devices] == [True] * 4
    assert sum("health checks are unavailable" in r.getMessage() for r in warnings_logged) == 1

    # What still turns a chip Unhealthy: a call that fails, a device node that vanishes.
    path.write_text(on_every_device(TWO_BI_V150, "unsupported=health").replace("minor=0 ", "minor=0 fail=memory "))
    (dev_root / "dev" / "iluvatar3").unlink()
    polled = inventory.with_statuses(backend.health(inventory))

    assert polled.statuses()["GPU-b0-c0"].problems == ("nvmlDeviceGetMemoryInfo failed: Unknown Error",)
    assert polled.statuses()["GPU-b1-c1"].problems == ("device node /dev/iluvatar3 missing",)
    assert [device.healthy for device in plan(polled, Config()).devices] == [False, False]


def test_same_board_not_supported_keeps_every_chip_alone(config, backend_for):
    config(TWO_BI_V150.replace("minor=3 ", "minor=3 unsupported=same_board "))

    inventory = backend_for().discover()

    assert chip_uuids(inventory) == [["GPU-b0-c1"], ["GPU-b0-c0"], ["GPU-b1-c0"], ["GPU-b1-c1"]]
    assert not any(board.membership_known for board in inventory.boards)
    assert all(status == ChipStatus() for status in inventory.statuses().values())


def test_failed_same_board_answer_leaves_that_chip_alone(config, backend_for):
    config(TWO_BI_V150.replace("minor=3 ", "minor=3 fail=same_board "))

    inventory = backend_for().discover()

    assert chip_uuids(inventory) == [["GPU-b0-c0", "GPU-b0-c1"], ["GPU-b1-c0"], ["GPU-b1-c1"]]
    assert all(board.membership_known for board in inventory.boards)  # placed, so each is short of a chip


def test_init_failure(config, backend_for, libs):
    config("fail_init=1\n" + TWO_BI_V150)

    with pytest.raises(BackendError) as raised:
        backend_for().discover()

    assert not isinstance(raised.value, NoDevicesError)
    assert str(raised.value) == (
        f"IXML library {libs['full']} failed to initialise: nvmlInit_v2 failed: Driver Not Loaded"
    )


def test_old_library_init_failure_names_the_unversioned_call(config, backend_for):
    config("fail_init=1\n")

    with pytest.raises(BackendError, match="nvmlInit failed: Driver Not Loaded"):
        backend_for("old").discover()


def test_no_devices(config, backend_for, libs):
    config("driver=4.1.0\n")

    with pytest.raises(NoDevicesError, match=f"IXML library {libs['full']} reports no Iluvatar devices"):
        backend_for().discover()


def test_device_whose_uuid_cannot_be_read(config, backend_for):
    config(TWO_BI_V150.replace("minor=2 ", "minor=2 fail=uuid "))
    backend = backend_for()

    inventory = backend.discover()

    placeholder = "IX-UNKNOWN-2-0000-ca-00.0"
    assert placeholder == placeholder_uuid(2, "0000:ca:00.0")
    assert chip_uuids(inventory)[1] == [placeholder, "GPU-b1-c1"]
    chip = next(chip for chip in inventory.chips() if chip.uuid == placeholder)
    assert (chip.minor, chip.product, chip.memory_mib) == (2, "Iluvatar BI-V150", 32768)
    assert chip.status.problems == ("nvmlDeviceGetUUID failed: Unknown Error",)
    assert inventory.statuses()["GPU-b1-c1"] == ChipStatus()
    assert backend.health(inventory)[placeholder].problems == ("nvmlDeviceGetUUID failed: Unknown Error",)
    assert len(inventory.links) == 6


def test_device_whose_minor_cannot_be_read(config, backend_for):
    config(TWO_BI_V150.replace("minor=3 ", "minor=3 fail=minor "))

    inventory = backend_for().discover()

    chip = next(chip for chip in inventory.chips() if chip.uuid == "GPU-b1-c1")
    assert chip.minor is None
    assert chip.device_node is None
    assert chip.status.problems == ("nvmlDeviceGetMinorNumber failed: Unknown Error",)
    assert sum(status == ChipStatus() for status in inventory.statuses().values()) == 3


def test_device_whose_handle_cannot_be_had(config, backend_for):
    config(TWO_BI_V150.replace("minor=3 ", "minor=3 fail=handle "))

    inventory = backend_for().discover()

    chip = inventory.boards[-1].chips[0]
    assert (chip.uuid, chip.minor) == ("IX-UNKNOWN-3", None)
    assert chip.status.problems == ("nvmlDeviceGetHandleByIndex_v2 failed: Unknown Error",)
    assert chip_uuids(inventory)[:2] == [["GPU-b0-c0", "GPU-b0-c1"], ["GPU-b1-c0"]]


def test_other_call_failures_are_chip_problems(config, backend_for):
    config(TWO_BI_V150.replace("minor=0 ", "minor=0 fail=name,memory,pci,health "))

    inventory = backend_for().discover()

    chip = inventory.boards[0].chips[0]
    assert (chip.uuid, chip.product, chip.memory_mib, chip.bus_id) == ("GPU-b0-c0", "unknown", 0, "")
    assert chip.status.problems == (
        "nvmlDeviceGetName failed: Unknown Error",
        "nvmlDeviceGetPciInfo_v3 failed: Unknown Error",
        "nvmlDeviceGetMemoryInfo failed: Unknown Error",
        "ixmlDeviceGetHealth failed: Unknown Error",
    )


def test_missing_device_node_and_control_node(config, backend_for, tmp_path):
    config(TWO_BI_V150)
    root = make_dev_root(tmp_path / "partial", [0, 1, 3], itrctl=False)

    inventory = backend_for(root=root).discover()

    statuses = inventory.statuses()
    assert statuses["GPU-b1-c0"].problems == ("device node /dev/iluvatar2 missing",)
    assert statuses["GPU-b1-c0"].reasons() == ("device node /dev/iluvatar2 missing",)
    assert statuses["GPU-b0-c0"] == ChipStatus()
    assert inventory.control_nodes == ()


def test_health_sees_device_nodes_come_and_go(config, backend_for, dev_root):
    config(TWO_BI_V150)
    backend = backend_for()
    inventory = backend.discover()

    (dev_root / "dev" / "iluvatar1").unlink()
    statuses = backend.health(inventory)

    assert statuses["GPU-b0-c1"].problems == ("device node /dev/iluvatar1 missing",)
    assert statuses["GPU-b0-c0"] == ChipStatus()


def test_health_of_chips_the_library_no_longer_lists(config, backend_for):
    path = config(TWO_BI_V150)
    backend = backend_for()
    inventory = backend.discover()

    path.write_text("\n".join(TWO_BI_V150.splitlines()[:-1]) + "\n")
    statuses = backend.health(inventory)

    assert statuses["GPU-b1-c1"] == ChipStatus(present=False)
    assert statuses["GPU-b1-c1"].reasons() == ("not present",)
    assert statuses["GPU-b0-c0"] == ChipStatus()


def test_health_when_the_library_cannot_count(config, backend_for):
    path = config(TWO_BI_V150)
    backend = backend_for()
    inventory = backend.discover()

    path.write_text("fail_count=1\n" + TWO_BI_V150)
    statuses = backend.health(inventory)

    assert len(statuses) == 4
    for status in statuses.values():
        assert not status.present
        assert status.problems[0].endswith("cannot count devices: nvmlDeviceGetCount_v2 failed: Unknown Error")


def test_discover_is_repeatable_and_close_shuts_down(config, backend_for):
    config(TWO_BI_V150)
    backend = backend_for()

    first = backend.discover()
    assert backend.discover() == first

    backend.close()
    assert backend.discover() == first


def test_wrong_library_is_rejected_naming_the_file(backend_for, libs):
    with pytest.raises(BackendError) as raised:
        backend_for("upnp").discover()

    message = str(raised.value)
    assert message.startswith(f"{libs['upnp']} is not Iluvatar's IXML library")
    assert "libupnp" in message


def test_missing_library_path(tmp_path):
    missing = tmp_path / "nowhere" / "libixml.so"

    with pytest.raises(BackendError, match=f"IXML library {missing} does not exist"):
        IxmlBackend(str(missing)).discover()


def test_load_library_reports_unloadable_files(tmp_path):
    junk = tmp_path / "libixml.so"
    junk.write_text("not an ELF file")

    with pytest.raises(BackendError, match=f"cannot load the IXML library {junk}"):
        load_library(str(junk))


def test_find_library_prefers_explicit_then_corex_paths(tmp_path):
    lib64 = tmp_path / "lib64" / "libixml.so"
    lib = tmp_path / "lib" / "libixml.so"
    lib.parent.mkdir()
    lib.touch()
    candidates = (str(lib64), str(lib))

    assert find_library(str(lib), candidates=()) == str(lib)
    assert find_library(None, candidates=candidates) == str(lib)
    lib64.parent.mkdir()
    lib64.touch()
    assert find_library(None, candidates=candidates) == str(lib64)
    assert "ixml" in find_library(None, candidates=())


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:8A:00.0", "0000:8a:00.0"),
        ("0000:8A:00.0", "0000:8a:00.0"),
        ("00010000:03:1F.7", "10000:03:1f.7"),
        ("garbage", ""),
        ("", ""),
    ],
)
def test_normalize_bus_id(nvml, sysfs):
    assert normalize_bus_id(nvml) == sysfs


def test_read_numa_node(tmp_path):
    sysfs = make_sysfs(tmp_path, {"0000:8a:00.0": "1", "0000:8b:00.0": "-1", "0000:8c:00.0": "x"})

    assert read_numa_node(sysfs, "0000:8a:00.0") == 1
    assert read_numa_node(sysfs, "0000:8b:00.0") is None
    assert read_numa_node(sysfs, "0000:8c:00.0") is None
    assert read_numa_node(sysfs, "0000:8d:00.0") is None
    assert read_numa_node(sysfs, "") is None


def test_check_device_nodes_is_idempotent(tmp_path):
    root = make_dev_root(tmp_path, [0])
    inventory = Inventory(
        boards=(Board("Iluvatar MR-V100", (Chip("GPU-a", 0, "p"), Chip("GPU-b", 5, "p"), Chip("GPU-c", None, "p"))),)
    )

    checked = check_device_nodes(check_device_nodes(inventory, root), root)

    assert checked.control_nodes == (CONTROL_NODE,)
    assert checked.statuses() == {
        "GPU-a": ChipStatus(),
        "GPU-b": ChipStatus(problems=("device node /dev/iluvatar5 missing",)),
        "GPU-c": ChipStatus(),
    }


def test_concurrent_discover_and_health(config, backend_for):
    config(TWO_BI_V150)
    backend = backend_for()
    inventory = backend.discover()

    def poll(_: int) -> bool:
        return backend.discover() == inventory and backend.health(inventory) == inventory.statuses()

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(poll, range(40)))


def _cli() -> list[str]:
    script = Path(sys.executable).parent / "ix-device-plugin"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from ix_device_plugin.cli import main; raise SystemExit(main())"]


@pytest.mark.parametrize(("splitboard", "capacity", "allocatable"), [("false", 2, 1), ("true", 4, 3)])
def test_cli_list_reports_the_double_devices(libs, tmp_path, splitboard, capacity, allocatable):
    conf = tmp_path / "ixml_double.conf"
    conf.write_text(TWO_BI_V150.replace("minor=1 ", "minor=1 health=0x10 "))
    root = make_dev_root(tmp_path / "root", [0, 1, 2, 3])
    env = {key: value for key, value in os.environ.items() if not key.startswith("IX_")}
    env[CONFIG_ENV] = str(conf)

    listed = subprocess.run(
        [
            *_cli(),
            "list",
            "--backend",
            "ixml",
            "--ixml-library",
            str(libs["full"]),
            "--dev-root",
            str(root),
            "--splitboard",
            splitboard,
            "--output",
            "json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert report["driver_version"] == "4.1.0"
    assert [[chip["uuid"] for chip in board["chips"]] for board in report["boards"]] == [
        ["GPU-b0-c0", "GPU-b0-c1"],
        ["GPU-b1-c0", "GPU-b1-c1"],
    ]
    assert all(board["board_position_known"] for board in report["boards"])
    assert (report["capacity"], report["allocatable"]) == (capacity, allocatable)
    assert report["control_nodes"] == [CONTROL_NODE]
    health = {device["id"]: device["health"] for device in report["devices"]}
    unhealthy = {device_id for device_id, state in health.items() if state == "Unhealthy"}
    assert unhealthy == ({"GPU-b0-c1"} if splitboard == "true" else {"GPU-b0-c0"})
    sick = next(device for device in report["devices"] if device["id"] in unhealthy)
    assert sick["reasons"] == ["GPU-b0-c1: ECC"]


def test_library_not_found_on_the_search_path_says_where_it_looked():
    with pytest.raises(BackendError) as caught:
        load_library("libixml-not-installed.so")
    message = str(caught.value)
    assert "cannot load the IXML library libixml-not-installed.so" in message
    assert "/usr/local/corex/lib64/libixml.so" in message and "IX_IXML_LIBRARY" in message


def test_cuda_driver_version_is_read_where_the_library_answers(config, backend_for):
    config("cuda=10020\n" + TWO_BI_V150)
    assert backend_for().discover().cuda_version == "10020"
    config(TWO_BI_V150)  # the double answers NOT_SUPPORTED without cuda=
    assert backend_for().discover().cuda_version is None
    assert backend_for("no_telemetry").discover().driver_version == "4.1.0"
