"""What a soak costs the machine it runs on, from /proc: the CPU busy over the run and the most memory in use, of
everything the machine runs (the cluster, the agent, the workload, the soak itself, and anything else running)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


def cpu_times(proc: Path = PROC) -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU since boot: all but idle and waiting for I/O count as busy."""
    fields = [int(word) for word in (proc / "stat").read_text().splitlines()[0].split()[1:9]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def memory_used_kib(proc: Path = PROC) -> int:
    """MemTotal - MemAvailable: what the machine's processes and kernel hold that it cannot give back."""
    info = {line.split(":")[0]: int(line.split()[1]) for line in (proc / "meminfo").read_text().splitlines()}
    return info["MemTotal"] - info["MemAvailable"]


@dataclass
class Cost:
    proc: Path = PROC
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    began: tuple[int, int] = (0, 0)
    peak_kib: int = 0

    def start(self) -> None:
        self.began = cpu_times(self.proc)
        self.sample()

    def sample(self) -> None:
        self.peak_kib = max(self.peak_kib, memory_used_kib(self.proc))

    def busy(self) -> float:
        """The share of the machine's CPU time busy since start (1.0: every core busy throughout)."""
        busy, total = cpu_times(self.proc)
        return (busy - self.began[0]) / max(1, total - self.began[1])

    def line(self) -> str:
        busy = self.busy()
        return (
            f"The machine ({self.cores} cores): {busy:.0%} of its CPU busy over the run ({busy * self.cores:.1f} "
            f"cores on average), at most {self.peak_kib / 1024:.0f} MiB of memory in use (everything it runs)."
        )
