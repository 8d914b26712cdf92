"""The node's one role and one reset turn: one pod of the agent at a time whatever its mode, and none while a pod of
the release before still holds the old name of its mode (an "old pod" here is a FileLock on that name)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.waits import stays, until
from packaging.version import Version

import ix_device_plugin
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.locks import FileLock, TurnLock
from ix_device_plugin.runtime.noderole import (
    EARLIER_DRA_RESET,
    EARLIER_DRA_ROLE,
    EARLIER_NAMES_REMOVED_IN,
    EARLIER_PLUGIN_ROLE,
    NODE_DIR,
    RESET_FILE,
    ROLE_FILE,
    NodeLocks,
    NodeRole,
    reset_turn,
)


def plugin_role(plugins: Path) -> NodeRole:
    return NodeRole(NodeLocks.device_plugin(plugins).role, "acting for the node")


def dra_role(plugins: Path) -> NodeRole:
    return NodeRole(NodeLocks.dra(plugins).role, "publishing the node's slices")


@contextlib.contextmanager
def old_pod(path: Path) -> Iterator[FileLock]:
    """A pod of the release before, holding its mode's lock until the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    assert lock.try_take()
    try:
        yield lock
    finally:
        lock.release()


def test_the_earlier_names_are_gone_by_the_release_that_removes_them() -> None:
    # A pre-release of that release (0.3.0rc1) is that release too: the names go before it ships.
    version = Version(ix_device_plugin.__version__).release
    assert version < Version(EARLIER_NAMES_REMOVED_IN).release, (
        f"ix-device-plugin {ix_device_plugin.__version__} has reached {EARLIER_NAMES_REMOVED_IN}: remove the "
        "earlier lock names (runtime/noderole.py EARLIER_*) and what the README and docs/deployment.md say of the "
        "update from the release before 0.1.0"
    )


def test_both_modes_take_the_same_role_and_reset_turn_in_the_directory_both_daemonsets_mount(tmp_path: Path) -> None:
    plugin, dra = NodeLocks.device_plugin(tmp_path), NodeLocks.dra(tmp_path)
    assert plugin.role[0] == dra.role[0] == tmp_path / NODE_DIR / ROLE_FILE
    assert plugin.reset[0] == dra.reset[0] == tmp_path / NODE_DIR / RESET_FILE
    assert all(path.parent == tmp_path / NODE_DIR for path in (*plugin.role, *plugin.reset))  # all it mounts
    assert set(dra.role[1:]) == {tmp_path / EARLIER_PLUGIN_ROLE, tmp_path / EARLIER_DRA_ROLE}
    assert dra.reset[1:] == (tmp_path / EARLIER_DRA_RESET,)


@pytest.mark.parametrize(("first", "second"), [(plugin_role, dra_role), (dra_role, plugin_role)])
def test_a_pod_of_either_mode_waits_while_one_of_the_other_mode_holds_the_role(
    tmp_path: Path, first: Callable[[Path], NodeRole], second: Callable[[Path], NodeRole]
) -> None:
    acting, standby = first(tmp_path), second(tmp_path)
    assert acting.take_at_start() and acting.held
    assert not standby.take_at_start() and not standby.held and not standby.unusable
    assert standby.waiting_for == tmp_path / NODE_DIR / ROLE_FILE
    acting.release()
    assert standby.try_take() and standby.held
    assert not acting.try_take()
    standby.release()


@pytest.mark.parametrize(
    ("role", "earlier"),
    [(plugin_role, EARLIER_PLUGIN_ROLE), (dra_role, EARLIER_PLUGIN_ROLE), (dra_role, EARLIER_DRA_ROLE)],
)
def test_a_new_pod_does_not_act_while_an_old_pod_holds_the_old_name_and_keeps_the_nodes_lock_meanwhile(
    tmp_path: Path, role: Callable[[Path], NodeRole], earlier: str
) -> None:
    new, other_new = role(tmp_path), plugin_role(tmp_path)
    with old_pod(tmp_path / earlier):
        assert not new.take_at_start() and not new.held
        assert new.waiting_for == tmp_path / earlier
        assert not other_new.try_take()  # the node's lock is the waiting pod's: it is next
    assert new.try_take() and new.held and new.waiting_for == new.path
    rollback = FileLock(tmp_path / earlier)  # an old pod started again (a rollback) waits for the new one
    assert not rollback.try_take()
    new.release()
    assert rollback.try_take()
    rollback.release()


def test_an_old_name_that_cannot_serve_as_a_lock_is_not_waited_for(tmp_path: Path) -> None:
    (tmp_path / EARLIER_DRA_ROLE).mkdir(parents=True)
    role = dra_role(tmp_path)
    assert role.take_at_start() and role.held and not role.unusable
    role.release()


def test_the_nodes_lock_that_cannot_serve_leaves_the_pod_on_standby(tmp_path: Path) -> None:
    (tmp_path / NODE_DIR / ROLE_FILE).mkdir(parents=True)
    role = plugin_role(tmp_path)
    assert not role.take_at_start() and not role.held
    assert "is a directory" in role.unusable


async def test_the_standby_takes_over_within_a_poll_of_the_old_pods_stop(tmp_path: Path) -> None:
    new = dra_role(tmp_path)
    acting = asyncio.Event()

    async def work() -> None:
        acting.set()
        await asyncio.Event().wait()

    with old_pod(tmp_path / EARLIER_DRA_ROLE):
        assert not new.take_at_start()
        task = asyncio.create_task(new.run(work))
        await stays(lambda: not acting.is_set(), 0.3)
    await until(acting.is_set, timeout=2)
    assert new.held
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not new.held


async def test_an_old_name_replaced_on_the_node_stops_the_work_until_the_role_is_had_again(tmp_path: Path) -> None:
    role = plugin_role(tmp_path)
    assert role.take_at_start()
    earlier = tmp_path / EARLIER_PLUGIN_ROLE
    earlier.unlink()
    earlier.write_text("")
    async with asyncio.timeout(5):
        await role.until_lost()
    role.release()


async def test_the_reset_turn_is_one_at_a_time_across_modes(tmp_path: Path) -> None:
    plugin = reset_turn(NodeLocks.device_plugin(tmp_path).reset, timeout=5, poll=0.01)
    dra = reset_turn(NodeLocks.dra(tmp_path).reset, timeout=5, poll=0.01)
    inside: list[str] = []
    most = 0

    async def reset(turn: TurnLock, name: str) -> None:
        nonlocal most
        async with turn.held():
            inside.append(name)
            most = max(most, len(inside))
            await asyncio.sleep(0.05)
            inside.remove(name)

    await asyncio.gather(*(reset(turn, name) for turn, name in [(plugin, "p"), (dra, "d")] * 3))
    assert most == 1


@pytest.mark.parametrize(
    ("locks", "earlier"), [(NodeLocks.dra, EARLIER_DRA_RESET), (NodeLocks.device_plugin, f"{NODE_DIR}/{RESET_FILE}")]
)
async def test_a_reset_waits_for_an_old_pods_reset_under_the_old_name_and_gives_up_naming_it(
    tmp_path: Path, locks: Callable[[Path], NodeLocks], earlier: str
) -> None:
    turn = reset_turn(locks(tmp_path).reset, timeout=0.3, poll=0.01)
    with old_pod(tmp_path / earlier), pytest.raises(OutputError, match=f"{earlier}.*a GPU reset"):
        async with turn.held():
            pytest.fail("reset while an old pod resets")
    async with turn.held():
        pass


async def test_a_reset_turn_given_up_lets_go_of_what_it_had(tmp_path: Path) -> None:
    turn = reset_turn(NodeLocks.dra(tmp_path).reset, timeout=0.2, poll=0.01)
    with old_pod(tmp_path / EARLIER_DRA_RESET), pytest.raises(OutputError):
        async with turn.held():
            pass
    node = FileLock(tmp_path / NODE_DIR / RESET_FILE)
    assert node.try_take()  # the node's lock, taken first, was let go
    node.release()
