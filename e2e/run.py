"""`make e2e`: the end-to-end suite and its lanes, their clusters side by side (docs/testing.md, "Side by side").

Most of a scenario's time is spent waiting on the cluster (pods starting, the kubelet's loops, grace periods), so
one cluster leaves the machine mostly idle. Here:

1. What needs the network is built first, on the host: the project's image (harness/project_image.py) and the NRI
   injector's binary (harness/injector.py, cached by its sources). The slots below reach nothing outside.
2. The default lane's suite runs in --workers pytest-xdist workers, each in a slot (e2e/cluster/slot.sh) with a
   cluster of its own; they take the test files as they free up, longest first (e2e/tests/conftest.py).
3. Meanwhile the lanes are built (`make e2e-build-lanes`, at a lower CPU priority) and their tests run in one more
   slot, one lane after another. Their output goes to a log, printed after the suite's.

Exit status 0 when the suite and every lane passed. Root only (make e2e checks first).

    python e2e/run.py [--workers N] [--lanes "A B"] [--lane-tests "FILE ..."] [-- PYTEST_ARG ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

E2E_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(E2E_DIR))

from harness.build import CACHE, LANE_VARIABLE, REPO_ROOT  # noqa: E402
from harness.injector import build_binary  # noqa: E402
from harness.project_image import PREPARED_VARIABLE, build_project_image, missing_tools  # noqa: E402
from harness.slots import SLOT_SCRIPT  # noqa: E402

PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
# On SIGTERM or SIGINT each pytest gets SIGINT (it tears its cluster down) and this long before SIGKILL.
STOP_GRACE_S = 180.0


def arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="e2e/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="clusters the default lane's suite is spread over")
    parser.add_argument("--lanes", default="", help="the lanes to run beside it (e2e/lanes/NAME.env), space-separated")
    parser.add_argument("--lane-tests", default="", help="the test files each lane runs, space-separated")
    parser.add_argument("pytest_args", nargs="*", help="given to every pytest (after --)")
    parsed = parser.parse_args(argv)
    if parsed.workers < 1:
        parser.error("--workers: at least 1")
    return parsed


def slot_mount_points() -> list[Path]:
    """The host folders slot.sh mounts over (`slot.sh --mount-points`)."""
    listed = subprocess.run([str(SLOT_SCRIPT), "--mount-points"], check=True, capture_output=True, text=True)
    return [Path(line) for line in listed.stdout.split()]


@contextlib.contextmanager
def mount_points(points: Sequence[Path]) -> Iterator[None]:
    """points (and their missing parents) made where the host has none for the run, and removed after, deepest
    first, each only while empty."""
    made: list[Path] = []
    for point in points:
        missing = [p for p in (point, *point.parents) if not p.exists()]
        point.mkdir(parents=True, exist_ok=True)
        made += reversed(missing)
    try:
        yield
    finally:
        for path in reversed(made):
            with contextlib.suppress(OSError):
                path.rmdir()


def prepare() -> dict[str, str]:
    """Build what needs the network; the environment that tells the slots where it is."""
    started = time.monotonic()
    build_binary(CACHE)
    env: dict[str, str] = {}
    if not missing_tools():  # else the suite's project_image fixture says what is missing
        env[PREPARED_VARIABLE] = str(build_project_image(CACHE).archive)
    say(f"prepared the images in {time.monotonic() - started:.0f} s")
    return env


def say(line: str) -> None:
    sys.stdout.write(f"e2e/run.py: {line}\n")
    sys.stdout.flush()


class Children:
    """The pytest processes running now, stopped together on SIGTERM or SIGINT."""

    def __init__(self) -> None:
        self.running: set[subprocess.Popen[bytes]] = set()
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def run(self, argv: list[str], env: dict[str, str], output: int | None = None) -> int:
        with self.lock:
            if self.stopping.is_set():
                return 1
            child = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT)
            self.running.add(child)
        try:
            return child.wait()
        finally:
            with self.lock:
                self.running.discard(child)

    def stop(self, *_: object) -> None:
        with self.lock:
            self.stopping.set()
            children = list(self.running)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGINT)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in children:
            try:
                child.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                child.kill()


def run_lanes(
    children: Children,
    lanes: list[str],
    tests: list[str],
    args: list[str],
    env: dict[str, str],
    log: Path,
    results: dict[str, int],
) -> None:
    """Build the lanes, then run tests in each, one slot after another; results: lane -> exit status."""
    with log.open("ab") as out:
        build = ["nice", "-n", "10", "make", "--no-print-directory", "-C", str(REPO_ROOT), "e2e-build-lanes"]
        if children.run([*build, f"E2E_LANES={' '.join(lanes)}"], env, out.fileno()) != 0:
            results.update(dict.fromkeys(lanes, 2))
            return
        for lane in lanes:
            out.write(f"\n== lane {lane}: {' '.join(tests)}\n".encode())
            out.flush()
            argv = [str(SLOT_SCRIPT), *PYTEST, "-n", "0", *tests, *args]
            results[lane] = children.run(argv, {**env, LANE_VARIABLE: lane}, out.fileno())


def suite_argv(workers: int, args: list[str]) -> list[str]:
    """pytest over e2e/tests in workers slots. pyproject's addopts are replaced: their -n would replace the --tx list
    (pytest-xdist makes plain local workers of -n)."""
    worker = f"popen//python={SLOT_SCRIPT} {sys.executable}"
    tx = [option for _ in range(workers) for option in ("--tx", worker)]
    return [*PYTEST, "-o", "addopts=-ra", *tx, "--dist", "loadfile", "--durations=20", "e2e/tests", *args]


def main(argv: Sequence[str]) -> int:
    options = arguments(argv)
    lanes, lane_tests = options.lanes.split(), options.lane_tests.split()
    children = Children()
    signal.signal(signal.SIGTERM, children.stop)
    signal.signal(signal.SIGINT, children.stop)
    env = dict(os.environ)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = E2E_DIR / ".logs" / f"lanes-{stamp}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with mount_points(slot_mount_points()):
        env.update(prepare())
        results: dict[str, int] = {}
        lanes_thread = threading.Thread(
            target=run_lanes, args=(children, lanes, lane_tests, options.pytest_args, env, log, results), daemon=True
        )
        if lanes:
            say(f"lanes {' '.join(lanes)} run beside the suite; their output: {log}")
            lanes_thread.start()
        started = time.monotonic()
        suite = children.run(suite_argv(options.workers, options.pytest_args), env)
        say(f"the suite ended ({suite}) after {time.monotonic() - started:.0f} s")
        if lanes:
            lanes_thread.join()
            say(f"the lanes ended after {time.monotonic() - started:.0f} s; their output follows")
            sys.stdout.write(log.read_text(errors="replace"))
    failed = [lane for lane in lanes if results.get(lane) != 0]
    if failed:
        say(f"failed in lane(s): {' '.join(failed)}")
    if suite != 0:
        say(f"the suite failed (pytest exit status {suite})")
    return 0 if suite == 0 and not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
