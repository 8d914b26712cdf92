"""Files in the kubelet's plugins directory that another process wrote (the node-health record, the node role's
lock), met by a real plugin process: it starts, registers and answers Allocate; a bad file is said once, naming
the path and the fix, and set aside or waited out."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.support import RESOURCE, spawn_plugin, stop_process
from helpers.waits import until

from ix_device_plugin.healing.record import NODE_DIR, RECORD_FILE, record_path
from ix_device_plugin.runtime.noderole import ROLE_FILE
from ix_device_plugin.standins.kubelet import KubeletStandIn


@pytest.fixture
def plugins(plugin_dir: Path) -> Path:
    """The kubelet plugins directory spawn_plugin hands the plugin."""
    return plugin_dir.parent / "plugins"


@pytest.fixture
def plugin_log(short_dir: Path) -> Path:
    return short_dir / "plugin.log"


@pytest.fixture
def running(plugin_dir: Path, plugin_log: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The plugin processes a test starts, stopped at its end."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        stop_process(process)


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


async def registered_and_allocating(kubelet: KubeletStandIn, process: subprocess.Popen[bytes], log: Path) -> None:
    """The process stays up, registers, and answers an Allocate of a chip."""
    try:
        view = await kubelet.wait_registered(RESOURCE, capacity=2, timeout=15)
    except TimeoutError:
        pytest.fail(f"not registered (exit code {process.poll()}):\n{read(log)}")
    device = sorted(view.devices)[0]
    response = await kubelet.allocate(RESOURCE, [[device]])
    assert len(response.container_responses) == 1
    assert process.poll() is None, read(log)


async def test_a_record_nested_deeper_than_any_parser_goes_is_set_aside_and_every_allocate_is_answered(
    kubelet: KubeletStandIn,
    plugin_dir: Path,
    plugins: Path,
    plugin_log: Path,
    running: list[subprocess.Popen[bytes]],
) -> None:
    """100 KB of `[`, well under the record's 1 MiB bound: refused like a malformed record, not a traceback."""
    record = record_path(plugins)
    record.parent.mkdir(parents=True)
    record.write_text("[" * 100_000)
    running.append(process := spawn_plugin(plugin_dir, log_file=plugin_log))
    await registered_and_allocating(kubelet, process, plugin_log)
    await until(lambda: any(p.name.startswith(f"{RECORD_FILE}.unreadable-") for p in record.parent.iterdir()), 10)
    log = read(plugin_log)
    assert f"node-health record {record} cannot be used: the document is nested more than 32 levels deep" in log
    assert "Traceback" not in log and "RecursionError" not in log


def symlink(path: Path) -> None:
    (path.parent / "elsewhere").write_text("")
    path.symlink_to(path.parent / "elsewhere")


def directory(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("")


def fifo(path: Path) -> None:
    os.mkfifo(path)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@pytest.mark.parametrize("make", [symlink, directory, fifo])
async def test_a_role_lock_that_cannot_serve_leaves_the_plugin_serving_on_standby_until_it_is_removed(
    kubelet: KubeletStandIn,
    plugin_dir: Path,
    plugins: Path,
    plugin_log: Path,
    running: list[subprocess.Popen[bytes]],
    make: Callable[[Path], None],
) -> None:
    lock = plugins / NODE_DIR / ROLE_FILE
    lock.parent.mkdir(parents=True)
    make(lock)
    running.append(process := spawn_plugin(plugin_dir, log_file=plugin_log))
    await registered_and_allocating(kubelet, process, plugin_log)
    said = [line for line in read(plugin_log).splitlines() if str(lock) in line]
    assert len(said) == 1, said
    assert "cannot take the role of acting for node" in said[0] and "remove it" in said[0], said
    assert "this pod serves on standby" in said[0]
    assert f"(holding {lock}" not in read(plugin_log)

    remove(lock)
    await until(lambda: f"(holding {lock}" in read(plugin_log), timeout=15)
    assert lock.is_file() and not lock.is_symlink()
    assert process.poll() is None and "Traceback" not in read(plugin_log)
    await registered_and_allocating(kubelet, process, plugin_log)
