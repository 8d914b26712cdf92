"""What the kernel says about a process: resident memory, CPU time, threads (Linux /proc)."""

from __future__ import annotations

import os
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status, such as VmRSS or VmHWM, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    raise KeyError(f"/proc/{pid}/status has no {field}")


def rss_mib(pid: int) -> float:
    """Resident memory of pid in MiB."""
    return round(status_kib(pid, "VmRSS") / 1024, 2)


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory of pid in MiB."""
    return round(status_kib(pid, "VmHWM") / 1024, 2)


def threads(pid: int) -> int:
    """Number of threads of pid."""
    return len(os.listdir(f"/proc/{pid}/task"))


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time pid has used, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields after the parenthesised command name start at field 3 (state); utime is 14, stime 15.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
