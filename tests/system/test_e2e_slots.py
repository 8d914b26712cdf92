"""Clusters side by side (`make e2e`: e2e/run.py, e2e/cluster/slot.sh, e2e/harness/slots.py and runs.py): each
end-to-end process in a slot of its own, whose network, /dev and the kubelet's fixed folders nobody else sees, and
whose teardown of a dead run kills its own processes only.

slot.sh runs for real (root: unshare and mount); its locks are in a temporary cache. Nothing of a cluster is
started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.host_tools import require
from helpers.support import REPO_ROOT
from helpers.waits import until_sync

from e2e import run as e2e_run
from e2e.harness import slots
from e2e.harness.components import Binaries
from e2e.harness.runs import leftover_pids

SLOT = REPO_ROOT / "e2e" / "cluster" / "slot.sh"


def slot_missing() -> str | None:
    """What slot.sh needs that this host lacks (None: nothing)."""
    if os.geteuid() != 0:
        return "a slot needs root (unshare, mount), as make e2e does"
    tools = [tool for tool in ("unshare", "flock", "ip", "findmnt") if shutil.which(tool) is None]
    if tools:
        return f"a slot needs {', '.join(tools)} (util-linux, iproute2: e2e/cluster/packages.sh)"
    return None


@pytest.fixture
def slot_tools() -> None:
    require(slot_missing())


# What a slot shows of itself: its number, its addresses, whether a node made in its /dev is there, what is mounted
# on the kubelet's fixed folders, and the lock it holds.
PROBE = r"""
set -e
echo "slot=$IX_E2E_SLOT"
echo "addresses=$(ip -4 -o address show | awk '{print $4}' | sort | tr '\n' ' ')"
mknod "/dev/ix-slot-probe-$IX_E2E_SLOT" c 1 3
sleep "${HOLD:-0}"
echo "own-node=$(ls /dev | grep -c '^ix-slot-probe-' || true)"
for point in $(SLOT_SCRIPT --mount-points); do echo "fs $point=$(findmnt -n -o FSTYPE "$point" | tail -1)"; done
"""


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def mount_points() -> Iterator[None]:
    """The host folders slot.sh needs, as e2e/run.py makes them (and removes them after, where it made them)."""
    with e2e_run.mount_points(e2e_run.slot_mount_points()):
        yield


def slot_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IX_")}
    return {**env, "IX_E2E_CACHE": str(cache), **extra}


def probe(cache: Path, hold: float = 0) -> subprocess.Popen[str]:
    script = PROBE.replace("SLOT_SCRIPT", str(SLOT))
    return subprocess.Popen(
        [str(SLOT), "bash", "-c", script],
        env=slot_env(cache, HOLD=str(hold)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def answers(process: subprocess.Popen[str]) -> dict[str, str]:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return dict(line.split("=", 1) for line in out.splitlines())


# ------------------------------------------------------------------ pure parts


def test_the_slot_number_is_read_from_the_environment_and_anything_else_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(slots.SLOT_VARIABLE, raising=False)
    assert slots.number() is None
    monkeypatch.setenv(slots.SLOT_VARIABLE, "3")
    assert slots.number() == 3
    monkeypatch.setenv(slots.SLOT_VARIABLE, "3; rm")
    with pytest.raises(AssertionError, match="a slot is a number"):
        slots.number()


def test_each_slot_has_its_own_cgroup_root_lock_and_record_and_the_host_run_keeps_its_names(tmp_path: Path) -> None:
    assert slots.cgroup_root(None) == "ix-e2e"
    assert {slots.cgroup_root(1), slots.cgroup_root(2)} == {"ix-e2e-slot1", "ix-e2e-slot2"}
    assert slots.run_files(tmp_path, None) == (tmp_path / "run.lock", tmp_path / "current-run.json")
    files = {slots.run_files(tmp_path, n) for n in (None, 1, 2)}
    assert len({path for pair in files for path in pair}) == 6


def test_the_suite_runs_in_one_slot_per_worker_with_files_shared_out() -> None:
    argv = e2e_run.suite_argv(2, ["-q", "-x"])
    workers = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tx"]
    assert workers == [f"popen//python={SLOT} {sys.executable}"] * 2
    # pyproject's -n would replace the --tx list with plain local workers
    assert argv[argv.index("-o") + 1] == "addopts=-ra" and "-n" not in argv
    assert argv[argv.index("--dist") + 1] == "loadfile"
    assert argv[-3:] == ["e2e/tests", "-q", "-x"]


def test_the_mount_points_are_made_for_the_run_and_only_what_was_made_is_removed(tmp_path: Path) -> None:
    kept = tmp_path / "var" / "log"
    kept.mkdir(parents=True)
    (kept / "syslog").write_text("the host's")
    points = [tmp_path / "var" / "lib" / "kubelet", kept / "pods", tmp_path / "run" / "nri"]
    with e2e_run.mount_points(points):
        assert all(point.is_dir() for point in points)
        (tmp_path / "run" / "left-by-someone").write_text("")
    assert not (tmp_path / "var" / "lib").exists()
    assert not (kept / "pods").exists() and (kept / "syslog").read_text() == "the host's"
    assert (tmp_path / "run").is_dir() and not (tmp_path / "run" / "nri").exists()


def test_run_refuses_no_worker() -> None:
    with pytest.raises(SystemExit):
        e2e_run.arguments(["--workers", "0"])
    parsed = e2e_run.arguments(["--lanes", "a b", "--", "-q", "-k", "dra"])
    assert parsed.lanes.split() == ["a", "b"] and parsed.pytest_args == ["-q", "-k", "dra"]


# ------------------------------------------------------------------ slot.sh for real


@pytest.mark.usefixtures("slot_tools")
def test_two_slots_side_by_side_have_their_own_network_dev_and_kubelet_folders(cache: Path, mount_points: None) -> None:
    first, second = probe(cache, hold=3), probe(cache, hold=3)
    a, b = answers(first), answers(second)
    assert {a["slot"], b["slot"]} == {"1", "2"}
    for seen in (a, b):
        assert seen["addresses"].split() == ["10.254." + seen["slot"] + ".1/24", "127.0.0.1/8"]
        assert seen["own-node"] == "1", "each slot sees the node it made, not the other's"
        for point in e2e_run.slot_mount_points():
            assert seen[f"fs {point}"] == "tmpfs", seen
    assert not list(Path("/dev").glob("ix-slot-probe-*")), "a node made in a slot reached the host's /dev"
    assert answers(probe(cache))["slot"] == "1", "a slot is free again once its command has exited"


@pytest.mark.usefixtures("slot_tools")
def test_a_slot_writes_nothing_but_its_commands_output_on_stdout(cache: Path, mount_points: None) -> None:
    """A pytest-xdist worker's stdin and stdout are its channel to the controller."""
    done = subprocess.run(
        [str(SLOT), "printf", "only this"], env=slot_env(cache), capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, "only this"), done.stderr


@pytest.mark.usefixtures("slot_tools")
def test_a_slot_refuses_when_a_mount_point_is_missing_and_says_which(cache: Path, tmp_path: Path) -> None:
    """slot.sh as it is, with one of its mount points moved somewhere that does not exist."""
    missing = tmp_path / "no-such" / "kubelet"
    script = tmp_path / "slot.sh"
    script.write_text(SLOT.read_text().replace("(/var/lib/kubelet ", f"({missing} ", 1))
    script.chmod(0o755)
    done = subprocess.run([str(script), "true"], env=slot_env(cache), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"slot.sh: {missing} is missing on the host" in done.stderr


@pytest.mark.usefixtures("slot_tools")
def test_a_dead_runs_leftovers_are_its_own_processes_not_another_slots(tmp_path: Path) -> None:
    """Both slots run the same binaries: recovery (runs.recover) and the teardown kill only those in the run's
    network namespace, or naming its work directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sleeper = bin_dir / "sleep"
    shutil.copy2(shutil.which("sleep") or "/bin/sleep", sleeper)
    binaries = Binaries(bin_dir, tmp_path / "cni")
    here = subprocess.Popen([str(sleeper), "60"])
    beside = subprocess.Popen(["unshare", "--net", "--", str(sleeper), "60"])
    naming = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path / "work")])
    try:

        def found(network: str | None) -> set[int]:
            return set(leftover_pids(binaries, tmp_path / "work", network)) & {here.pid, beside.pid, naming.pid}

        def in_its_namespace() -> bool:
            with contextlib.suppress(OSError):
                return os.readlink(f"/proc/{beside.pid}/exe") == str(sleeper)
            return False

        until_sync(in_its_namespace, 10, message="the second sleeper running in its own network namespace")
        assert slots.netns(beside.pid) != slots.netns()
        assert found(slots.netns()) == {here.pid, naming.pid}
        assert found(None) == {here.pid, beside.pid, naming.pid}
    finally:
        for process in (here, beside, naming):
            process.kill()
            process.wait()


def test_a_record_of_a_dead_run_that_is_not_an_object_is_dropped(tmp_path: Path) -> None:
    from e2e.harness.runs import recover

    record = tmp_path / "current-run-slot1.json"
    record.write_text(json.dumps(["not", "a", "record"]))
    assert recover(Binaries(tmp_path, tmp_path), record, tmp_path) == []
    assert not record.exists()
