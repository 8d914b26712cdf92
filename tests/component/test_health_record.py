"""The node-health record equals what the pod acting for the node knows (device plugin mode): a write that fails
(a full disk) is tried again until it lands; a record removed or spoiled is written again; a pod on standby keeps
the last good record it followed and takes over from it; a reset cut short is done again; and the unreadable
versions kept aside are bounded."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.broken_chip import BrokenChip
from helpers.host_tools import missing
from helpers.reset_support import Ixsmi
from helpers.support import (
    IXML_DOUBLE_CONFIG,
    NO_NODE_FILES,
    RESOURCE,
    TWO_CHIPS,
    DaemonFactory,
    config_flags,
)
from helpers.waits import stays, until
from test_rollout import OLD, OLD_SOCKET, advertised, start_beside

from ix_device_plugin.api import HEALTHY, UNHEALTHY, api_pb2
from ix_device_plugin.core.allocation import AllocationError
from ix_device_plugin.core.healthrecord import KIND, ChipRecord, HealthRecord, record_text
from ix_device_plugin.healing.keeper import RecordKeeper
from ix_device_plugin.healing.record import ASIDE_KEPT, RECORD_FILE, RecordFile, record_path
from ix_device_plugin.runtime.files import OutputError, read_boot_id
from ix_device_plugin.standins.kubelet import KubeletStandIn
from ix_device_plugin.standins.podresources import PodResourcesStandIn


def record_of(short_dir: Path) -> dict:
    return json.loads(record_path(short_dir / "plugins").read_text())


def recorded(short_dir: Path, uuid: str) -> dict:
    """The chip's entry in the record now; {} when it has none, or the record is missing or not JSON."""
    try:
        return dict(record_of(short_dir)["chips"].get(uuid, {}))
    except (OSError, ValueError):
        return {}


class FullDisk:
    """Makes the record's directory refuse writes for real: a small tmpfs there, filled (ENOSPC), where this test
    may mount one (root); else a directory without write permission (EACCES)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.filler = directory / "filler"
        directory.mkdir(parents=True, exist_ok=True)
        self.mounted = False
        if os.geteuid() == 0:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(directory)], check=False)
            if done.returncode != 0:
                missing("root without the right to mount a small tmpfs: the disk cannot be filled for real")
            self.mounted = True

    def fill(self) -> None:
        if not self.mounted:
            self.directory.chmod(0o555)
            return
        with self.filler.open("wb", buffering=0) as stream, contextlib.suppress(OSError):
            while True:
                stream.write(b"\0" * 4096)
        with pytest.raises(OSError) as full:
            (self.directory / "probe").write_bytes(b"\0" * 4096)
        assert full.value.errno == errno.ENOSPC

    def free(self) -> None:
        if self.mounted:
            self.filler.unlink(missing_ok=True)
            (self.directory / "probe").unlink(missing_ok=True)
        else:
            self.directory.chmod(0o755)

    def close(self) -> None:
        self.free()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.directory)], check=False)


@pytest.fixture
def full_disk(short_dir: Path) -> Iterator[FullDisk]:
    disk = FullDisk(record_path(short_dir / "plugins").parent)
    yield disk
    disk.close()


async def test_a_record_write_that_fails_as_a_reset_ends_is_tried_again_until_it_lands(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, short_dir: Path, full_disk: FullDisk
) -> None:
    """The disk fills while GPU-x1 is reset: the write that ends its reservation fails, so the chip stays held out
    of service (Unhealthy to the kubelet) for as long as the record says it is reserved: a kubelet is never offered
    a chip whose Allocate is refused (it fails the pod for good). Once space returns the write lands with no other
    change on the node, and the chip is offered and given."""
    ixsmi.delay.write_text("1")
    _, view = await broken_chip.started()
    broken_chip.breaks(1, 48)
    await until(lambda: "reserved" in recorded(short_dir, "GPU-x1"), timeout=5)
    full_disk.fill()
    await stays(lambda: view.devices["GPU-x1"] == UNHEALTHY, for_=3.0, message="held out while the record says so")
    assert ixsmi.runs() == ["-r -i GPU-x1"] and "reserved" in recorded(short_dir, "GPU-x1")  # reset; write failed
    with pytest.raises(Exception, match="reserved for a GPU reset"):  # refused, as the kubelet was told
        await kubelet.allocate(RESOURCE, [["GPU-x1"]])
    full_disk.free()
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=20)
    entry = recorded(short_dir, "GPU-x1")  # written before the chip was offered: healthy, its one reset kept
    assert "reserved" not in entry and entry["phase"] == "healthy" and len(entry["resets"]) == 1
    response = await kubelet.allocate(RESOURCE, [["GPU-x1"]])
    assert len(response.container_responses) == 1
    assert ixsmi.runs() == ["-r -i GPU-x1"]


async def test_a_record_removed_or_spoiled_is_written_again_by_the_acting_pod(
    broken_chip: BrokenChip, short_dir: Path
) -> None:
    await broken_chip.started()
    broken_chip.breaks(1, 64)
    await until(lambda: recorded(short_dir, "GPU-x1").get("xids") == [64], timeout=5)
    record = record_path(short_dir / "plugins")
    written = record.read_text()
    for spoil in (record.unlink, lambda: record.write_text("{"), lambda: record.write_text(written.replace("64", "6"))):
        spoil()
        await until(lambda: recorded(short_dir, "GPU-x1").get("xids") == [64], timeout=5)
        assert record_of(short_dir)["chips"]["GPU-x1"]["phase"] == "operator"


def cut_short_record(short_dir: Path) -> None:
    """The record a stop during the reset of GPU-x1 (for a memory-controller error) leaves, in this boot."""
    record = record_path(short_dir / "plugins")
    record.parent.mkdir(parents=True)
    cut_short = {
        "minor": 1, "phase": "resetting", "causes": ["MC"], "attempts": 1, "note": "resetting (attempt 1)",
        "reserved": {"reason": "reserved for a GPU reset", "since": time.time()},
    }  # fmt: skip
    document = {"kind": KIND, "version": 1, "bootID": read_boot_id(), "chips": {"GPU-x1": cut_short}}
    record.write_text(json.dumps(document))


async def test_a_reset_cut_short_is_done_again_although_the_chips_error_cleared(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, short_dir: Path
) -> None:
    """A stop during the reset of GPU-x1 left it reserved; its error reads cleared at the next start. It may be half
    reset: it stays out of service until it is reset again."""
    cut_short_record(short_dir)
    ixsmi.delay.write_text("1")  # the first ListAndWatch message is read long before the reset is over
    _, view = await broken_chip.started()
    assert view.devices["GPU-x1"] == UNHEALTHY
    await kubelet.wait_for(lambda: view.devices["GPU-x1"] == HEALTHY, timeout=10)
    assert ixsmi.runs() == ["-r -i GPU-x1"]
    await until(lambda: recorded(short_dir, "GPU-x1") == {} and record_path(short_dir / "plugins").exists())


async def test_a_chip_whose_reset_was_cut_short_and_fails_again_stays_reserved_for_an_operator(
    broken_chip: BrokenChip, ixsmi: Ixsmi, kubelet: KubeletStandIn, short_dir: Path
) -> None:
    """The same, but ixsmi fails: the resets left (the bound counts the one cut short) fail, and the chip, reading
    healthy, stays out of service and reserved until an operator returns it."""
    cut_short_record(short_dir)
    ixsmi.code.write_text("3")
    _, view = await broken_chip.started()
    await until(lambda: recorded(short_dir, "GPU-x1").get("phase") == "operator", timeout=10)
    assert ixsmi.runs() == ["-r -i GPU-x1"] * 2
    assert "reserved" in recorded(short_dir, "GPU-x1")
    await stays(lambda: view.devices["GPU-x1"] == UNHEALTHY, for_=1.0, message="GPU-x1 advertised Unhealthy")
    with pytest.raises(Exception, match="Unhealthy"):
        await kubelet.allocate(RESOURCE, [["GPU-x1"]])


# ---- two pods: the standby keeps what it followed ---------------------------------------------------------------


def spawn_old_pod(broken_chip: BrokenChip, plugin_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    """The old pod of an update as a process of its own (so that it can be frozen and killed), over the C double."""
    broken_chip.dev_nodes()
    env = {key: value for key, value in os.environ.items() if not key.startswith("IX_")}
    env[IXML_DOUBLE_CONFIG] = str(broken_chip.conf)
    short_dir, library = broken_chip.short_dir, str(broken_chip.libs()["full"])
    command = [
        *(sys.executable, "-m", "ix_device_plugin", "run", "--backend", "ixml", "--ixml-library", library),
        *("--dev-root", str(short_dir), "--device-plugin-path", str(plugin_dir), *NO_NODE_FILES),
        *("--kubelet-plugins-directory-path", str(short_dir / "plugins"), "--pod-uid", OLD),
        *("--health-address", "off", "--health-interval", "0.1", *args),
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def test_the_standby_keeps_a_chip_needing_an_operator_out_when_the_record_goes_and_after_the_handover(
    broken_chip: BrokenChip, kubelet: KubeletStandIn, start_daemon: DaemonFactory, short_dir: Path, plugin_dir: Path
) -> None:
    """XID 64 on GPU-x1 during an update, seen and recorded by the old pod; the old pod freezes (it writes nothing
    more) and the record is removed, then spoiled: the standby keeps GPU-x1 out of service and refuses it; the old
    pod is killed, and the new one acts from what it knew: GPU-x1 stays out and the record is written again."""
    old = spawn_old_pod(broken_chip, plugin_dir)
    try:
        await kubelet.wait_registered(RESOURCE, capacity=2, timeout=15)
        settings = {**broken_chip.over_double(), "dev_root": short_dir}
        new, _ = await start_beside(kubelet, start_daemon, OLD_SOCKET, **settings)
        assert not new.acting
        broken_chip.breaks(1, 64)
        await until(lambda: advertised(new) == {"GPU-x0": HEALTHY, "GPU-x1": UNHEALTHY}, timeout=10)
        old.send_signal(signal.SIGSTOP)
        record = record_path(short_dir / "plugins")
        for spoil in (record.unlink, lambda: record.write_text("{")):
            spoil()
            await stays(lambda: advertised(new)["GPU-x1"] == UNHEALTHY, for_=1.0, message="GPU-x1 advertised Unhealthy")
            with pytest.raises(Exception, match="Unhealthy"):
                await kubelet.allocate(RESOURCE, [["GPU-x1"]])  # the newest registration answers: the standby
        old.kill()
        await asyncio.to_thread(old.wait, 10)
        await until(lambda: new.acting, timeout=10)
        await until(lambda: recorded(short_dir, "GPU-x1").get("xids") == [64], timeout=5)
        assert recorded(short_dir, "GPU-x1")["phase"] == "operator"
        await stays(lambda: advertised(new)["GPU-x1"] == UNHEALTHY, for_=0.5, message="GPU-x1 advertised Unhealthy")
        with pytest.raises(Exception, match="Unhealthy"):
            await kubelet.allocate(RESOURCE, [["GPU-x1"]])
    finally:
        if old.poll() is None:
            old.kill()
            old.wait(10)


async def test_the_standby_refuses_a_chip_reserved_by_the_frozen_acting_pod_when_the_record_goes_then_resets_it(
    broken_chip: BrokenChip,
    ixsmi: Ixsmi,
    kubelet: KubeletStandIn,
    start_daemon: DaemonFactory,
    pod_resources: PodResourcesStandIn,
    conf: Path,
    short_dir: Path,
    plugin_dir: Path,
) -> None:
    """The old pod reserves GPU-x1 for an XID 48 and is frozen in the middle of its reset; the record is removed,
    then spoiled: the standby still refuses GPU-x1 as reserved. The old pod is killed: the new one takes over the
    reservation it knew, resets GPU-x1 itself and returns it."""
    ixsmi.delay.write_text("10")
    healing = ("--self-healing", "true", "--ixsmi-path", ixsmi.path, "--sysfs-root", str(ixsmi.sysfs))
    old = spawn_old_pod(broken_chip, plugin_dir, *healing, "--pod-resources-socket", str(pod_resources.socket_path))
    try:
        await kubelet.wait_registered(RESOURCE, capacity=2, timeout=15)
        new, _ = await start_beside(
            kubelet, start_daemon, OLD_SOCKET, **broken_chip.over_double(), dev_root=short_dir,
            given=config_flags(self_healing="true"), pod_resources_socket=pod_resources.socket_path,
        )  # fmt: skip
        broken_chip.breaks(1, 48)
        await until(lambda: ixsmi.runs() == ["-r -i GPU-x1"], timeout=10)  # the old pod's reset runs
        await until(lambda: "reserved" in recorded(short_dir, "GPU-x1"), timeout=5)
        old.send_signal(signal.SIGSTOP)
        conf.write_text(TWO_CHIPS)  # the XID was the old pod's library's to tell: the new one learns it from the record
        request = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-x1"])])
        record = record_path(short_dir / "plugins")
        for spoil in (record.unlink, lambda: record.write_text("{")):
            spoil()
            await until(lambda: bool(new.node.record and new.node.record.unreadable) or not record.exists())
            with pytest.raises(AllocationError, match="held out of service for a reset"):
                await new._before_allocate(new.plan, request)
        ixsmi.delay.write_text("0")
        old.kill()
        await asyncio.to_thread(old.wait, 10)
        await until(lambda: new.acting, timeout=10)
        await until(lambda: advertised(new)["GPU-x1"] == HEALTHY, timeout=15)  # after its own reset
        assert ixsmi.runs() == ["-r -i GPU-x1"] * 2
        assert await new._before_allocate(new.plan, request) is None
    finally:
        if old.poll() is None:
            old.kill()
            old.wait(10)


# ---- the file ------------------------------------------------------------------------------------------------


def test_unreadable_versions_kept_aside_are_bounded_to_the_newest(tmp_path: Path) -> None:
    """Each bad version written over the record (a new file, as an atomic writer leaves it) is kept aside, the
    ASIDE_KEPT newest only; one spoiled again in place is not linked again."""
    path = record_path(tmp_path)
    path.parent.mkdir()
    file = RecordFile(path)
    for version in range(ASIDE_KEPT + 4):
        spoiled = path.with_name("spoiled")
        spoiled.write_text(f"{{ bad version {version}")
        os.replace(spoiled, path)
        assert file.read() is None and file.unreadable
    path.write_text("{ bad version again, in place")
    assert file.read() is None
    aside = [p for p in path.parent.iterdir() if p.name.startswith(f"{RECORD_FILE}.unreadable-")]
    assert len(aside) == ASIDE_KEPT
    kept = {p.read_text() for p in aside}
    newest = {f"{{ bad version {version}" for version in range(4, ASIDE_KEPT + 3)}
    assert kept == {*newest, "{ bad version again, in place"}


def test_the_last_good_record_is_known_while_the_file_is_gone_or_spoiled(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    file = RecordFile(path)
    assert file.known() is None
    good = HealthRecord(boot_id="b", writer="w", written=1.0)
    path.parent.mkdir()
    path.write_text(record_text(good))
    assert file.known() == good and file.holds_written(good) is False  # read, not written by this process
    path.unlink()
    assert file.read() is None and file.known() == good
    path.write_text("[")
    assert file.read() is None and file.known() == good
    file.write(good)
    assert file.holds_written(file.read())


def test_the_keeper_tries_a_failed_write_again_with_a_growing_delay_and_rewrites_a_file_not_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = RecordFile(record_path(tmp_path))
    said: list[str] = []
    keeper = RecordKeeper(file, said.append)
    first = HealthRecord(boot_id="b", writer="w")
    keeper.keep(first)
    assert file.read() is not None and keeper.retry_at is None
    real_write = file.write

    def full_disk(record: HealthRecord) -> None:
        raise OutputError(f"cannot write {file.path}: No space left on device")

    monkeypatch.setattr(file, "write", full_disk)
    second = HealthRecord(boot_id="b", writer="w", chips={"GPU-a": ChipRecord(xids=frozenset({64}))})
    delays = []
    for _ in range(3):
        keeper.keep(second)
        assert keeper.retry_at is not None
        delays.append(keeper.retry_at - time.monotonic())
    assert delays[0] < delays[1] < delays[2] <= 30 * 1.2
    with pytest.raises(OutputError):
        keeper.keep(second, must=True)
    keeper.keep(first)  # what the file holds already: nothing left to try
    assert keeper.retry_at is None
    monkeypatch.setattr(file, "write", real_write)
    keeper.keep(second)
    found = file.read()
    assert keeper.retry_at is None and found is not None and found.chips["GPU-a"].xids == {64}
    assert not keeper.check(found)  # its own
    file.path.write_text("{")
    assert keeper.check(file.read()) and said and "not JSON" in said[0]
    keeper.keep(second)  # written again although nothing it knows changed
    assert file.read() is not None and not keeper.check(file.read())
