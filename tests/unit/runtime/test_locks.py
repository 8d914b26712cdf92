"""FileLock: one holder at a time, a deadline on every wait, and a lock file that is what it should be; TurnLock:
this process's turn, then every file lock, within one deadline."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from helpers.waits import until

from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.locks import FileLock, LockError, TurnLock


def test_one_holder_at_a_time_and_the_next_after_release(tmp_path: Path) -> None:
    first, second = FileLock(tmp_path / "x.lock"), FileLock(tmp_path / "x.lock")
    assert first.try_take() and first.held and first.still_ours()
    assert not second.try_take() and not second.held
    first.release()
    assert not first.held and second.try_take()
    second.release()


def test_a_lock_file_removed_or_replaced_is_no_longer_held_and_the_new_file_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder = FileLock(path)
    assert holder.try_take()
    path.unlink()
    assert not holder.still_ours()
    newcomer = FileLock(path)
    assert newcomer.try_take() and newcomer.still_ours()  # a new file: the old lock guards nothing
    os.replace(tmp_path / "x.lock", tmp_path / "y.lock")
    path.write_text("")
    assert not newcomer.still_ours()
    holder.release()
    newcomer.release()


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda path: path.mkdir(), "is a directory; remove it"),
        (lambda path: path.symlink_to(path.parent / "elsewhere"), "is a symbolic link; not followed: remove it"),
        (lambda path: os.mkfifo(path), "is not a regular file; remove it"),
    ],
    ids=["directory", "symlink", "fifo"],
)
def test_a_lock_file_that_cannot_be_one_is_a_named_error(tmp_path: Path, make, why: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "x.lock"
    make(path)
    with pytest.raises(LockError, match=f"the lock file {path} {why}"):
        FileLock(path).try_take()
    assert not (tmp_path / "elsewhere").exists()


async def test_a_wait_is_said_in_the_log_and_ends_at_its_deadline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = FileLock(tmp_path / "x.lock")
    assert holder.try_take()
    with pytest.raises(LockError, match=r"x.lock is held by another process for more than 0.3s \(tests\)"):
        await FileLock(tmp_path / "x.lock").take(0.3, poll=0.01, purpose="tests")
    assert "which another process holds (tests); giving up after 0.3s" in caplog.text
    holder.release()


class Counted(FileLock):
    """A FileLock that counts its tries: a waiter that tried twice is inside its wait."""

    tries = 0

    def try_take(self) -> bool:
        self.tries += 1
        return super().try_take()


async def test_a_wait_ends_when_cancelled_and_one_let_go_meanwhile_is_taken(tmp_path: Path) -> None:
    holder = FileLock(tmp_path / "x.lock")
    assert holder.try_take()
    waiter = Counted(tmp_path / "x.lock")
    waiting = asyncio.create_task(waiter.take(60, poll=0.01, purpose="tests"))
    await until(lambda: waiter.tries >= 2, message="the waiter inside its wait")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not waiter.held
    tried = waiter.tries
    later = asyncio.create_task(waiter.take(60, poll=0.01, purpose="tests"))
    await until(lambda: waiter.tries >= tried + 2, message="the second waiter inside its wait")
    holder.release()
    async with asyncio.timeout(1):
        await later
    assert waiter.held
    waiter.release()


def test_taking_or_releasing_twice_changes_nothing(tmp_path: Path) -> None:
    lock = FileLock(tmp_path / "x.lock")
    assert lock.try_take() and lock.try_take()
    lock.release()
    lock.release()
    assert not lock.held and FileLock(tmp_path / "x.lock").try_take()


async def test_a_turn_is_one_task_at_a_time_and_holds_every_file_inside(tmp_path: Path) -> None:
    paths = (tmp_path / "node" / "a.lock", tmp_path / "b.lock")
    turn = TurnLock(paths, 5, poll=0.01, purpose="a test")
    inside: list[int] = []
    most = 0

    async def take(n: int) -> None:
        nonlocal most
        async with turn.held():
            inside.append(n)
            most = max(most, len(inside))
            assert not any(FileLock(path).try_take() for path in paths)  # another pod would wait
            await asyncio.sleep(0.01)
            inside.remove(n)

    await asyncio.gather(*(take(n) for n in range(4)))
    assert most == 1
    assert all(FileLock(path).try_take() for path in paths)  # all let go after the turn


async def test_a_turn_this_process_keeps_past_the_deadline_is_an_error_saying_who(tmp_path: Path) -> None:
    turn = TurnLock((tmp_path / "x.lock",), 5, poll=0.01, purpose="a test", busy="the other tests kept it")
    async with turn.held():
        with pytest.raises(OutputError, match=r"^the other tests kept it for more than 0.1s$"):
            async with turn.held(0.1):
                pytest.fail("two tasks inside one turn")


async def test_a_turn_another_process_holds_past_the_deadline_names_the_file_and_the_purpose(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    other = FileLock(path)
    assert other.try_take()
    with pytest.raises(OutputError, match=f"{path}.*a test"):
        async with TurnLock((path,), 0.1, poll=0.01, purpose="a test").held():
            pytest.fail("inside while another holds the file")
    other.release()
