"""Fixtures of the end-to-end suite: one real cluster per session, simulated GPUs as device nodes, a namespace
per test, and the components' log tails attached to every failure.

Run with `make e2e` (root, Go; builds the components first). Environment:
IX_E2E_CACHE (build cache), IX_E2E_LOG_DIR (logs; default e2e/.logs/<time>), IX_E2E_KEEP_WORKDIR=1 (keep
the cluster's work directory after the run), CI=true (a skipped scenario fails the run: harness/skips.py),
IX_E2E_LANE=NAME (the cluster of e2e/lanes/NAME.env, built by `make e2e-build-lanes`; `make e2e-lanes`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import slots
from harness.build import CACHE, E2E_DIR, built_binaries, current_lane, stack
from harness.cluster import Cluster
from harness.components import Binaries
from harness.dra import EXTENDED_VALUES, OWN_SLICES, Driver, dra_chart_objects, pod_bound_kubeconfig
from harness.helm import of_kind
from harness.host import mounts_under
from harness.injector import build_binary as build_injector_binary
from harness.injector import image_name as injector_image_name
from harness.injector import injector_image
from harness.kube import Kubectl, Obj
from harness.plugin import bi_v150_chips, device_nodes
from harness.procs import describe_logs
from harness.project_image import (
    BuiltImage,
    build_project_image,
    missing_tools,
    package_version,
    prepared_project_image,
)
from harness.release import forget_node_labels
from harness.runs import exclusive_run, leftover_pids
from harness.skips import register as register_skip_report

FAILURE_LOG_LINES = 25
NEEDS_ROOT = "the end-to-end cluster needs root (kubelet, containerd, mounts, cgroups, device nodes)"


def pytest_configure(config: pytest.Config) -> None:
    register_skip_report(config)


# The files that take longest, first: pytest-xdist's workers (e2e/run.py) take files in collection order as they
# free up, so a long file taken last would keep one cluster running alone while the other has finished.
LONGEST_FIRST = ("test_soak.py", "test_unprivileged.py", "test_fleet.py", "test_soak_checks.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: within a file, and among the others, the order stays


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The soak's lines, from each run's report (record_property): in the process that prints them, also when the
    soak ran in a pytest-xdist worker."""
    from soak import report as soak_report

    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == soak_report.REPORT_PROPERTY:
            soak_report.REPORTS.append(str(value))
        elif name == soak_report.SUMMARY_PROPERTY:
            soak_report.SUMMARIES.append(str(value))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The soak's lines last, one per run, for tools to read (e2e/soak/report.py)."""
    from soak.report import REPORTS, SUMMARIES

    for line in REPORTS + SUMMARIES:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def binaries() -> Binaries:
    """The built components. Not root ends the run with an error (a run of nothing but skips would read as a pass),
    and so does a build that is not complete.
    """
    if os.geteuid() != 0:
        pytest.exit(NEEDS_ROOT, returncode=pytest.ExitCode.USAGE_ERROR)
    found, why = built_binaries()
    if found is None:
        pytest.fail(why)
    return found


@pytest.fixture(scope="session")
def log_dir() -> Path:
    default = E2E_DIR / ".logs" / time.strftime("%Y%m%d-%H%M%S")
    directory = Path(os.environ.get("IX_E2E_LOG_DIR") or default)
    slot = slots.number()
    if slot is not None:  # clusters side by side (e2e/run.py): each its own folder of logs
        directory = directory.with_name(f"{directory.name}-slot{slot}")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture(scope="session")
def gpu_device_nodes(binaries: Binaries) -> Iterator[list[Path]]:
    """/dev/iluvatar0..3 and /dev/itrctl for the simulated 2 x BI-V150, for the whole session."""
    with device_nodes([chip.minor for chip in bi_v150_chips()]) as made:
        yield made


@pytest.fixture(scope="session")
def cluster(binaries: Binaries, log_dir: Path, gpu_device_nodes: list[Path]) -> Iterator[Cluster]:
    """The running cluster; torn down at the end of the session, which fails if anything is left behind.

    One run per machine at a time (a lock in the build cache); the remains of a run that was killed are
    cleaned first.
    """
    workdir = Path(tempfile.mkdtemp(prefix="ix-e2e-"))
    releases = stack()
    with exclusive_run(CACHE, binaries, workdir, log_dir, releases):
        try:
            started = Cluster(binaries, workdir, log_dir, stack=releases).start()
        except BaseException:
            if not mounts_under(workdir):
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        try:
            yield started
        finally:
            problems = started.stop()
            problems += kill_leftovers(binaries, workdir)
            if not problems and not os.environ.get("IX_E2E_KEEP_WORKDIR"):
                started.remove_workdir()
            sys.stderr.write(f"\ne2e: lane {current_lane() or 'default'}, logs in {log_dir}\n")
            if problems:
                pytest.fail("teardown left things behind:\n" + "\n".join(problems))


def kill_leftovers(binaries: Binaries, workdir: Path) -> list[str]:
    """Kill what still runs a cluster binary or names the work directory (a plugin a test did not stop)."""
    problems = []
    for pid in leftover_pids(binaries, workdir, slots.netns()):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            os.kill(pid, signal.SIGKILL)
            problems.append(f"process left running, killed: {pid} {argv[:200]}")
    return problems


@pytest.fixture(autouse=True)
def _node_without_device_access_label(request: pytest.FixtureRequest) -> None:
    """Each scenario on the cluster starts with the node as a new one is: without the label
    iluvatar.com/gpu.device-access that an agent of an earlier scenario wrote (it outlives the agent: the soak's
    privileged agent's `privileged` would keep the chart's unprivileged DaemonSet off the node)."""
    if "cluster" in request.fixturenames:
        forget_node_labels(request.getfixturevalue("cluster"))


@pytest.fixture(scope="session")
def admin(cluster: Cluster) -> Kubectl:
    return cluster.admin


@pytest.fixture
def namespace(request: pytest.FixtureRequest, admin: Kubectl) -> Iterator[str]:
    """A namespace for this test, deleted (with its pods, waiting for them) afterwards."""
    name = "t-" + re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:50].strip("-")
    admin("create", "namespace", name)
    try:
        yield name
    finally:
        admin("delete", "namespace", name, "--wait=true", "--timeout=90s", timeout=120)


@pytest.fixture(scope="session")
def nri_injector_image(cluster: Cluster) -> str:
    """The NRI device injector's image (the chart's default sidecar), built from nri-injector/ and imported."""
    binary, seconds = build_injector_binary(CACHE)
    name = injector_image_name(package_version())
    cluster.import_image(injector_image(binary, package_version()), "nri-injector")
    assert name in cluster.ctr("images", "ls", "-q").stdout.split()
    sys.stderr.write(f"\ne2e: nri-injector built in {seconds:.1f} s (0: cached)\n")
    return name


@pytest.fixture(scope="session")
def project_image(cluster: Cluster, nri_injector_image: str) -> BuiltImage:
    """The image, built the documented offline way and imported into the node's containerd (`ctr import`), once for
    every DaemonSet scenario."""
    missing = missing_tools()
    if missing:
        needs = ", ".join(missing)
        pytest.skip(f"building the image offline needs {needs}: run e2e/cluster/packages.sh as root (make e2e does)")
    built = prepared_project_image() or build_project_image(CACHE)
    cluster.import_image_file(built.archive)
    listed = cluster.ctr("images", "ls", "-q").stdout.split()
    assert built.name in listed, listed
    return built


# ------------------------------------------------------------------ the DRA driver (test_dra*.py)


@pytest.fixture(scope="module")
def dra_objects(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Obj]]:
    """The chart's DRA objects but the DaemonSet (DeviceClass, ServiceAccount, RBAC), applied; removed after."""
    objects = dra_chart_objects(cluster, tmp_path_factory.mktemp("helm-dra"))
    cluster.admin.apply(objects)
    try:
        yield objects
    finally:
        for obj in reversed(objects):
            namespace = obj["metadata"].get("namespace")
            cluster.admin.delete(obj["kind"], obj["metadata"]["name"], namespace, wait=False)


@pytest.fixture(scope="module")
def driver_kubeconfig(
    cluster: Cluster, dra_objects: list[Obj], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """A token of the chart's ServiceAccount iluvatar-dra-driver bound to a pod on the node, as the DaemonSet's
    pod has one: the driver has exactly the chart's RBAC. The pod is deleted after the module.
    """
    directory = tmp_path_factory.mktemp("dra-token")
    pod = f"iluvatar-dra-driver-{directory.name}"
    path = pod_bound_kubeconfig(cluster, "kube-system", "iluvatar-dra-driver", pod, directory / "kubeconfig")
    try:
        yield path
    finally:
        cluster.admin.delete("pod", pod, "kube-system", wait=False)


@pytest.fixture(scope="module")
def driver(cluster: Cluster, driver_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Driver]:
    """The DRA driver over the node's 2 x BI-V150, ready; stopped and its slices deleted after the module."""
    running = Driver(cluster, tmp_path_factory.mktemp("dra-driver"), driver_kubeconfig)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        cluster.admin("delete", "resourceslice", "-l", OWN_SLICES, "--ignore-not-found")


@pytest.fixture(scope="module")
def extended_class(cluster: Cluster, dra_objects: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Obj]:
    """The chart's DeviceClass for `iluvatar.com/gpu` (dra.extendedResourceName), applied for the module."""
    classes = of_kind(dra_chart_objects(cluster, tmp_path_factory.mktemp("helm-ext"), EXTENDED_VALUES), "DeviceClass")
    (device_class,) = [c for c in classes if c["spec"].get("extendedResourceName")]
    cluster.admin.apply(device_class)
    yield device_class
    cluster.admin.delete("DeviceClass", device_class["metadata"]["name"], wait=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failure, attach the tail of every component's and plugin's log to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "cluster" in getattr(item, "fixturenames", ()):
        directory = item.funcargs.get("log_dir") if hasattr(item, "funcargs") else None
        if directory is None:
            return
        logs = sorted(Path(directory).glob("*.log"), key=lambda path: path.stat().st_mtime)
        report.sections.append(("e2e logs", describe_logs(logs, FAILURE_LOG_LINES)))
