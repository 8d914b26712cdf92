"""What a soak costs the machine (e2e/soak/cost.py), from a /proc of our own."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.soak_modules import load

cost_module = load("cost")


def test_the_cost_of_a_run_is_the_machines_cpu_busy_since_its_start_and_its_most_memory_in_use(tmp_path: Path) -> None:
    proc = tmp_path
    meminfo = "MemTotal:       8000000 kB\nMemFree:        1000 kB\nMemAvailable:   {} kB\n"

    def machine(busy: int, idle: int, available: int) -> None:
        (proc / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
        (proc / "meminfo").write_text(meminfo.format(available))

    machine(busy=1000, idle=9000, available=6_000_000)
    cost = cost_module.Cost(proc=proc, cores=2)
    cost.start()
    machine(busy=1300, idle=9100, available=5_000_000)  # 300 of 400 ticks busy since start
    cost.sample()
    machine(busy=1500, idle=9500, available=7_000_000)  # 500 of 1000
    cost.sample()
    assert cost.busy() == 0.5 and cost.peak_kib == 3_000_000
    assert cost.line().startswith("The machine (2 cores): 50% of its CPU busy over the run (1.0 cores on average)")
