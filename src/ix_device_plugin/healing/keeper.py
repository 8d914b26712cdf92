"""The node-health record kept equal to what the pod acting for the node knows.

The healer says what it knows; the keeper writes it when that changed, and also when the file no longer holds what
was written last (someone removed it, spoiled it or wrote something else: the acting pod follows the file too). A
write that fails, a full disk, is tried again with backoff (jitter included) until it lands, however quiet the node:
a reservation that a failed write left in the file would keep a healthy chip refused. Only the acting pod writes;
a pod on standby uses the keeper to say once what became of the file it follows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from ix_device_plugin.core.healthrecord import HealthRecord, record_text
from ix_device_plugin.healing.record import RecordFile
from ix_device_plugin.runtime.backoff import Backoff
from ix_device_plugin.runtime.files import OutputError
from ix_device_plugin.runtime.logs import OncePerError

log = logging.getLogger(__name__)

RETRY, RETRY_CAP = 0.5, 30.0  # seconds between tries of a record write that failed: doubling, with jitter


class RecordKeeper:
    """Writes the node-health record in file; unreadable(why) tells (a Node Event) of a file that cannot be used."""

    def __init__(self, file: RecordFile, unreadable: Callable[[str], None]) -> None:
        self.file = file
        self.retry_at: float | None = None  # monotonic time a write that failed is tried again
        self._unreadable = unreadable
        self._written = ""  # the text of what was written last, its time left at 0 ("": write whatever is there)
        self._errors = OncePerError(log, logging.WARNING)
        self._retry = Backoff(initial=RETRY, cap=RETRY_CAP)
        self._unreadable_said = ""
        self._gone_said = False

    def keep(self, record: HealthRecord, must: bool = False) -> None:
        """Write record (its time is set here) unless it is what the file holds from the last write; a failure is
        said once and tried again at retry_at, and raised (OutputError) when must is set."""
        text = record_text(replace(record, written=0.0))  # as the file says it: times to the millisecond
        if text == self._written:
            self.retry_at = None  # what the file holds already (a write that failed meanwhile replaced nothing)
            return
        try:
            self.file.write(replace(record, written=time.time()))
        except OutputError as error:
            self.retry_at = time.monotonic() + self._retry.next_delay()
            self._errors.failed("node-health record: %s; trying again until it is written", error)
            if must:
                raise
            return
        self._errors.succeeded("node-health record %s written", self.file.path)
        self._retry.reset()
        self.retry_at, self._written = None, text

    def write_anew(self) -> None:
        """The next keep writes whatever the file holds (this process starts acting for the node)."""
        self._written = ""

    def check(self, found: HealthRecord | None) -> bool:
        """Acting for the node: found was read from the file; True (said) when it is not what was written last, and
        the next keep writes it again."""
        if not self._written or self.file.holds_written(found):
            return False
        self.say_unreadable()
        what = "was removed" if found is None and not self.file.unreadable else "is not what this pod wrote"
        log.warning("node-health record %s %s: writing it again from what this pod knows", self.file.path, what)
        self._written = ""
        return True

    def say_unreadable(self) -> None:
        """Tell once of each reason the file cannot be used."""
        if self.file.unreadable and self.file.unreadable != self._unreadable_said:
            self._unreadable_said = self.file.unreadable
            self._unreadable(f"{self.file.unreadable}; kept aside, not trusted")

    def say_gone(self, gone: bool) -> None:
        """On standby: tell once that the file is gone or cannot be used while the last good record is kept."""
        if gone and not self._gone_said and self.file.last_good is not None:
            log.warning("node-health record %s is gone or cannot be used: keeping what it said last until the pod "
                        "acting for the node writes it again", self.file.path)  # fmt: skip
        self._gone_said = gone
