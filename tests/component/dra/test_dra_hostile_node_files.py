"""Files in the kubelet's plugins directory that another process wrote, met by the DRA driver: a node-health record
nested past any parser's depth and a node role lock that cannot serve as one. The driver starts and prepares
claims; the record is set aside, the lock said once and waited out."""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.dra_support import DraNode, answer
from helpers.waits import until

from ix_device_plugin.dra.claimspec import cdi_spec_file
from ix_device_plugin.healing.record import RECORD_FILE, record_path
from ix_device_plugin.runtime.errors import StartupError
from ix_device_plugin.runtime.noderole import EARLIER_DRA_ROLE, NODE_DIR, ROLE_FILE


async def prepared(node: DraNode, name: str, device: str) -> None:
    """A claim for device is prepared without an error."""
    driver = node.drivers[-1]
    kubelet = await node.kubelet(driver)
    claim = node.claim(name, [device])
    try:
        assert answer(await kubelet.prepare([claim]), claim[2]).error == ""
    finally:
        await kubelet.close()


async def test_a_record_nested_deeper_than_any_parser_goes_is_set_aside_and_claims_are_prepared(
    node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    record = record_path(node.root / "plugins")
    record.parent.mkdir(parents=True)
    record.write_text("[" * 100_000)
    with caplog.at_level(logging.ERROR):
        await node.start()
    await node.wait_slice(lambda devices: len(devices) == 6)
    await prepared(node, "one-gpu", "gpu-1")
    assert any(p.name.startswith(f"{RECORD_FILE}.unreadable-") for p in record.parent.iterdir())
    assert any("the document is nested more than 32 levels deep" in r.getMessage() for r in caplog.records)


def symlink(path: Path) -> None:
    (path.parent / "elsewhere").write_text("")
    path.symlink_to(path.parent / "elsewhere")


def directory(path: Path) -> None:
    path.mkdir()


def fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize("make", [symlink, directory, fifo])
async def test_a_role_lock_that_cannot_serve_is_said_once_and_the_slices_are_published_once_it_is_removed(
    node: DraNode, caplog: pytest.LogCaptureFixture, make: Callable[[Path], None]
) -> None:
    lock = node.root / "plugins" / NODE_DIR / ROLE_FILE
    lock.parent.mkdir(parents=True)
    make(lock)
    with caplog.at_level(logging.INFO):
        driver = await node.start()
        await prepared(node, "one-gpu", "gpu-1")  # a standby prepares claims
        assert node.slice() is None and not driver.node.role.held
        said = [r for r in caplog.records if str(lock) in r.getMessage() and r.levelno >= logging.WARNING]
        assert len(said) == 1, [r.getMessage() for r in said]
        assert said[0].levelno == logging.ERROR and "remove it" in said[0].getMessage()
        assert "this pod serves on standby" in said[0].getMessage()
        shutil.rmtree(lock) if lock.is_dir() and not lock.is_symlink() else lock.unlink()
        await node.wait_slice(lambda devices: len(devices) == 6, timeout=15)
    assert driver.node.role.held and lock.is_file() and not lock.is_symlink()
    await until(lambda: any("can serve as a lock again" in r.getMessage() for r in caplog.records))


async def test_an_earlier_releases_role_lock_that_cannot_serve_is_not_waited_for(
    node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    """No pod of the release before could hold a directory as its lock: the driver publishes, saying so once."""
    earlier = node.root / "plugins" / EARLIER_DRA_ROLE
    earlier.mkdir(parents=True)
    with caplog.at_level(logging.INFO):
        driver = await node.start()
        await node.wait_slice(lambda devices: len(devices) == 6, timeout=15)
    assert driver.node.role.held
    said = [r.getMessage() for r in caplog.records if str(earlier) in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(said) == 1 and "not waited for" in said[0], said


async def test_a_directory_in_place_of_the_checkpoint_stops_the_start_with_an_error_naming_it(node: DraNode) -> None:
    """The driver cannot keep its claims without the file (a rename over a directory fails), so it does not serve
    claims it could not remember; the error names the path and what is there, never a traceback."""
    checkpoint = node.checkpoint_file
    checkpoint.mkdir(parents=True)
    with pytest.raises(StartupError, match=rf"{re.escape(str(checkpoint))}.*Is a directory"):
        await node.start()


async def test_a_claim_spec_holding_a_nul_is_skipped_by_name_and_the_driver_starts(
    node: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    node.cdi_dir.mkdir(parents=True, exist_ok=True)
    spec = node.cdi_dir / cdi_spec_file("0f6c3c5e-0b4e-4a57-9a83-3f2c1d7e9a10")
    spec.write_bytes(b"kind: gpu.iluvatar.com/claim\x00\n")
    with caplog.at_level(logging.ERROR):
        await node.start()
    await prepared(node, "one-gpu", "gpu-1")
    assert any(f"{spec}: skipped" in r.getMessage() and "#x0000" in r.getMessage() for r in caplog.records)
