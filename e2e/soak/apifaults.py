"""Faults of what the agent stands on rather than of the chips: the API server restarted or slow, and the agent's
state directories full for a while.

- `apiserver-restart`: the e2e cluster's kube-apiserver stopped (SIGTERM, SIGKILL after 5 s) and started again.
- `apiserver-slow`: the kube-apiserver process stopped (SIGSTOP) for a few seconds and continued (SIGCONT): every
  request of the time waits, none is refused. A timer thread continues it, so that nothing of the soak that waits
  on the server meanwhile can stretch the pause.
- `disk-full`: the kubelet plugins directory's `iluvatar.com` (the node-health record) and, for DRA,
  `gpu.iluvatar.com` (the checkpoint, the driver's socket) are small tmpfs mounts for the whole soak (StateDisk);
  the fault fills them to the last byte and frees them when its time is up.

None of these breaks a chip; each is a quiet window (checker.healthy_since): a chip healthy through it must be back
in service within the bound after it ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

from harness.cluster import Cluster
from harness.host import mounts_under, unmount
from harness.procs import run

from .later import Later
from .schedule import Step
from .timeline import Timeline

KINDS = ("apiserver-restart", "apiserver-slow", "disk-full")
AFTER_S = 10.0  # how long after the fault the agent may take to catch up (relist, rewrite) before the bound runs
TMPFS_SIZE = "4m"
FILLER = "soak-disk-full.filler"
NOT_FILES = shutil.ignore_patterns("*.sock", FILLER)  # sockets belong to the process serving them


class StateDisk:
    """The agent's state directories, each on a tmpfs of its own for the soak, their files carried in and out, so
    that the node is left as if nothing had been mounted."""

    def __init__(self, plugins_dir: Path, names: Sequence[str]) -> None:
        self.directories = [plugins_dir / name for name in names]
        self.mounted: list[Path] = []

    def mount(self) -> None:
        for directory in self.directories:
            directory.mkdir(parents=True, exist_ok=True)
            saved = directory.with_name(directory.name + ".soak-saved")
            shutil.rmtree(saved, ignore_errors=True)
            shutil.copytree(directory, saved, symlinks=True, ignore=NOT_FILES)
            run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "soak-state", str(directory)])
            self.mounted.append(directory)
            shutil.copytree(saved, directory, symlinks=True, dirs_exist_ok=True, ignore=NOT_FILES)
            shutil.rmtree(saved, ignore_errors=True)

    def fill(self) -> list[Path]:
        """Every mounted directory full (a filler file written until ENOSPC); the fillers."""
        fillers = []
        for directory in self.mounted:
            filler = directory / FILLER
            descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                for chunk in (65536, 4096, 1):  # to the last byte: what is left after the big chunks too
                    with contextlib.suppress(OSError):
                        while os.write(descriptor, b"\0" * chunk):
                            pass
            finally:
                os.close(descriptor)
            fillers.append(filler)
        return fillers

    def free(self) -> None:
        for directory in self.mounted:
            (directory / FILLER).unlink(missing_ok=True)

    def release(self) -> None:
        """Unmount, the files the agent left there carried back onto the directory underneath (no filler)."""
        self.free()
        for directory in reversed(self.mounted):
            kept = directory.with_name(directory.name + ".soak-kept")
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(directory, kept, symlinks=True, ignore=NOT_FILES)
            unmount(directory)
            if not mounts_under(directory):
                shutil.copytree(kept, directory, symlinks=True, dirs_exist_ok=True, ignore=NOT_FILES)
            shutil.rmtree(kept, ignore_errors=True)
        self.mounted.clear()


class ApiFaults:
    def __init__(self, cluster: Cluster, timeline: Timeline, later: Later, state_directories: Sequence[str]) -> None:
        self.cluster, self.timeline, self.later = cluster, timeline, later
        self.disk = StateDisk(cluster.plugins_dir, state_directories)
        self.paused: threading.Timer | None = None
        self.full: list[int] = []  # the quiet windows of the disk being full, open until it is freed (their indices)

    def do(self, step: Step) -> None:
        timeline = self.timeline
        began = timeline.now()
        if step.kind == "apiserver-restart":
            self.cluster.restart_apiserver()
            timeline.note(f"API server restarted in {timeline.now() - began:.1f} s")
            timeline.outages.append((began, timeline.now()))
            timeline.quiet.append((began, timeline.now() + AFTER_S))
        elif step.kind == "apiserver-slow":
            self.pause(step.duration)
            timeline.outages.append((began, began + step.duration))
            timeline.quiet.append((began, began + step.duration + AFTER_S))
        elif step.kind == "disk-full":
            fillers = self.disk.fill()
            timeline.note(f"filled {', '.join(str(f.parent) for f in fillers)}")
            self.later.after(step.duration, self.freed)
            # open until the disk is freed: a step late on the schedule holds the freeing up (Later), and for all
            # that time the agent can write none of its state
            self.full.append(len(timeline.quiet))
            timeline.quiet.append((began, float("inf")))
        else:
            raise AssertionError(f"no way to cause {step.kind}")

    def pause(self, seconds: float) -> None:
        process = self.cluster.processes["kube-apiserver"]
        process.signal(signal.SIGSTOP)
        self.paused = threading.Timer(seconds, lambda: process.signal(signal.SIGCONT))
        self.paused.start()

    def freed(self) -> None:
        self.disk.free()
        timeline = self.timeline
        for index in self.full:
            timeline.quiet[index] = (timeline.quiet[index][0], timeline.now() + AFTER_S)
        self.full.clear()
        timeline.note("state directories freed")

    def heal_all(self) -> None:
        """The end: the API server running, the disk free (unmounted later, once the agent is stopped)."""
        if self.paused is not None:
            self.paused.cancel()
            self.cluster.processes["kube-apiserver"].signal(signal.SIGCONT)
        if self.full:
            self.freed()
        else:
            self.disk.free()
