"""One end-to-end run per cluster slot at a time, and the remains of a run that was killed cleaned before the next.

The cluster uses host-wide names (the kubelet's device-plugin path, the /ix-e2e cgroups, the bridge, the
/dev/iluvatar* nodes), so a run holds an exclusive lock for its lifetime and records its work directory and
network namespace. Runs side by side (e2e/run.py) are each in a slot of their own (harness/slots.py), with a lock
and record of their own. A record whose lock is free belongs to a run that died without tearing down (a CI
timeout, SIGKILL): its processes (the cluster's binaries in its network namespace, and any process naming its
work directory, such as the plugin) are killed and the rest is torn down as `Cluster.stop` does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from .cluster import KUBELET_DEVICE_PLUGIN_DIR, Cluster
from .components import CURRENT, Binaries, Stack
from .host import bind_source
from .slots import netns, number, run_files


def _cmdline(pid: str) -> list[str]:
    try:
        return [part.decode(errors="replace") for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return []


def leftover_pids(binaries: Binaries, workdir: Path, network: str | None) -> list[int]:
    """Processes running one of the cluster's binaries in the network namespace network (any, when None: a record of
    an older harness), or naming workdir on their command line. Another slot's cluster runs the same binaries in
    its own namespace, and is left alone."""
    found = []
    marker = str(workdir)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            exe = os.readlink(entry / "exe")
        except OSError:
            continue
        ours = exe.startswith(str(binaries.bin_dir) + "/") and network in (None, netns(entry.name))
        if ours or any(marker in part for part in _cmdline(entry.name)):
            found.append(int(entry.name))
    return found


def recover(binaries: Binaries, record: Path, logdir: Path, stack: Stack = CURRENT) -> list[str]:
    """Tear down what the run recorded in record left behind (binaries and stack: this run's lane's); what could not
    be cleaned."""
    try:
        recorded = json.loads(record.read_text())
        workdir = Path(recorded["workdir"])
    except (OSError, ValueError, KeyError, TypeError):
        record.unlink(missing_ok=True)
        return []
    for pid in leftover_pids(binaries, workdir, recorded.get("netns")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stale = Cluster(binaries, workdir, logdir, stack=stack)
    source = bind_source(KUBELET_DEVICE_PLUGIN_DIR)
    if source is not None and str(workdir) in source:
        stale.bind_mounts.append(KUBELET_DEVICE_PLUGIN_DIR)
    problems = stale.stop()
    if not problems:
        stale.remove_workdir()
        record.unlink(missing_ok=True)
    return problems


@contextlib.contextmanager
def exclusive_run(
    cache: Path, binaries: Binaries, workdir: Path, logdir: Path, stack: Stack = CURRENT
) -> Iterator[None]:
    """Hold the machine's (or this slot's) e2e lock while the body runs, after cleaning a dead run's remains."""
    cache.mkdir(parents=True, exist_ok=True)
    lock_path, record = run_files(cache, number())
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AssertionError(f"another end-to-end run holds {lock_path}") from None
        if record.exists():
            problems = recover(binaries, record, logdir, stack)
            if problems:
                raise AssertionError("the remains of an earlier run could not be cleaned:\n" + "\n".join(problems))
        record.write_text(json.dumps({"workdir": str(workdir), "pid": os.getpid(), "netns": netns()}))
        try:
            yield
        finally:
            record.unlink(missing_ok=True)
