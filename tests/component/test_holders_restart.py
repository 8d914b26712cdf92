"""Who holds a chip after a restart in device plugin mode: a container given a whole BI-V150 board under its first
chip's ID keeps it when `splitboard` is turned on live and the plugin restarts. The restarted pod reads that ID as
the board (the node's mark of whole boards served this boot), so the board's second chip is not reset under it;
once no container holds such an ID, the mark is forgotten. Real gRPC to the pod-resources stand-in."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ix_device_plugin.core.inventory import Board, Chip, Inventory
from ix_device_plugin.deviceplugin.chipguard import WHOLE_BOARDS_FILE, PodHolders, WholeBoardsMark
from ix_device_plugin.deviceplugin.state import Current, State
from ix_device_plugin.kubelet.podresources import PodResources
from ix_device_plugin.runtime.noderole import reset_turn
from ix_device_plugin.settings.config import Config
from ix_device_plugin.standins.podresources import PodResourcesStandIn

RESOURCE = "iluvatar.com/gpu"
BOARD = Inventory((Board("BI-V150", (Chip("GPU-a0", 0, "BI-V150"), Chip("GPU-a1", 1, "BI-V150"))),))
WHOLE = Config()
SPLIT = replace(Config(), splitboard=True)
HOLDER = "ml/trainer-0 (main)"


async def applied(version: int) -> None:
    return None


def plugin(pod_resources: PodResourcesStandIn, config: Config, mark: WholeBoardsMark) -> PodHolders:
    """One process of the plugin's chip guard, serving BOARD under config."""
    current = Current(State.of(BOARD, config))
    reader = PodResources(pod_resources.socket_path)
    turn = reset_turn((), 1.0)
    return PodHolders(reader, current, applied, settle=0.0, reset_turn=turn, turn_timeout=1.0, whole_boards=mark)


async def test_a_restart_after_splitboard_turned_on_still_reads_a_held_first_chip_id_as_the_board(
    pod_resources: PodResourcesStandIn, tmp_path: Path
) -> None:
    path = tmp_path / "iluvatar.com" / WHOLE_BOARDS_FILE
    pod_resources.pods = {("ml", "trainer-0"): {"main": {RESOURCE: ["GPU-a0"]}}}  # the whole board, given whole
    before = plugin(pod_resources, WHOLE, WholeBoardsMark(path, "boot-1"))
    assert await before.holder("GPU-a1") == HOLDER
    assert path.read_text() == "boot-1\n"

    after = plugin(pod_resources, SPLIT, WholeBoardsMark(path, "boot-1"))  # splitboard on, the plugin restarted
    assert await after.holder("GPU-a1") == HOLDER  # the board's second chip is not reset under the container

    pod_resources.pods = {}  # the pod is gone: no container can hold a whole board now
    assert await after.holder("GPU-a1") is None
    assert not path.exists()
    pod_resources.pods = {("ml", "trainer-1"): {"main": {RESOURCE: ["GPU-a0"]}}}  # given on the split node
    assert await after.holder("GPU-a1") is None  # the first chip alone


async def test_a_mark_of_another_boot_says_nothing(pod_resources: PodResourcesStandIn, tmp_path: Path) -> None:
    path = tmp_path / WHOLE_BOARDS_FILE
    path.write_text("boot-0\n")
    pod_resources.pods = {("ml", "trainer-0"): {"main": {RESOURCE: ["GPU-a0"]}}}
    after_reboot = plugin(pod_resources, SPLIT, WholeBoardsMark(path, "boot-1"))
    assert await after_reboot.holder("GPU-a1") is None


def test_an_unreadable_mark_reads_as_whole_boards_served(tmp_path: Path) -> None:
    path = tmp_path / WHOLE_BOARDS_FILE
    path.mkdir()  # not a file: a reset waits rather than hit a board someone may hold
    assert WholeBoardsMark(path, "boot-1").read() is True


def test_a_mark_that_is_a_symlink_a_fifo_or_huge_is_not_read_through(tmp_path: Path) -> None:
    link, fifo, huge = tmp_path / "link", tmp_path / "fifo", tmp_path / "huge"
    (tmp_path / "target").write_text("boot-1\n")
    link.symlink_to(tmp_path / "target")
    os.mkfifo(fifo)  # opened without blocking: never hangs
    huge.write_bytes(b"boot-1" + b" " * 10_000_000)
    assert [WholeBoardsMark(path, "boot-1").read() for path in (link, fifo, huge)] == [True, True, True]


@settings(max_examples=200, deadline=None)
@given(content=st.binary(max_size=200))
def test_any_bytes_in_the_mark_read_without_error(tmp_path_factory: object, content: bytes) -> None:
    path = Path(tmp_path_factory.mktemp("mark")) / WHOLE_BOARDS_FILE  # type: ignore[attr-defined]
    path.write_bytes(content)
    assert WholeBoardsMark(path, "boot-1").read() is (content.strip() == b"boot-1")
