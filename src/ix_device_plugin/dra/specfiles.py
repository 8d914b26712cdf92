"""The prepared claims' CDI spec files in the CDI directory.

Written, removed, and read back into claims when the checkpoint cannot say what is prepared. Written and removed
only by `DraState` under its lock (claimspec.py says what a spec holds). A spec this driver cannot read is skipped
with a message naming it, never removed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path

from ix_device_plugin.core.cdi import spec_text
from ix_device_plugin.dra.claimspec import SpecError, cdi_spec_file, claim_from_spec, claim_spec_files
from ix_device_plugin.dra.prepared import PreparedClaim, valid_uid
from ix_device_plugin.runtime.files import reason, remove_file, remove_stale_temporaries, write_atomically
from ix_device_plugin.settings.documents import DocumentError, load_yaml, read_file

log = logging.getLogger(__name__)

SPEC_LIMIT = 1024 * 1024


class ClaimSpecFiles:
    """The CDI spec file of each prepared claim of pool, in cdi_dir."""

    def __init__(self, cdi_dir: Path, pool: str) -> None:
        self.cdi_dir = cdi_dir
        self.pool = pool

    def any(self) -> bool:
        """Whether a claim spec is there (readable or not)."""
        return bool(claim_spec_files(self.cdi_dir))

    def write(self, claim: PreparedClaim, only_if_missing: bool = False) -> None:
        """Write the claim's spec atomically; OutputError."""
        path = self.cdi_dir / cdi_spec_file(claim.ref.uid)
        if only_if_missing and path.is_file() and not path.is_symlink():
            return
        write_atomically(path, spec_text(claim.spec))

    def remove(self, uid: str) -> None:
        """Remove the claim's spec (none there is fine); OutputError."""
        remove_file(self.cdi_dir / cdi_spec_file(uid))

    def remove_stale_temporaries(self) -> None:
        """Remove the temporary files of spec writes cut short."""
        remove_stale_temporaries(self.cdi_dir, cdi_spec_file("*"))

    def claims(self) -> dict[str, PreparedClaim]:
        """The claims the readable specs describe, by UID."""
        claims = {}
        for uid, path in claim_spec_files(self.cdi_dir):
            claim = self.read(uid, path)
            if claim is not None:
                claims[uid] = claim
        return claims

    def read(self, uid: str, path: Path) -> PreparedClaim | None:
        """The claim the spec at path describes; None (with a message naming it) when it cannot be read."""
        try:
            if not valid_uid(uid):
                raise SpecError(f"the file name does not hold a claim UID ({uid[:80]!r})")
            return claim_from_spec(uid, load_yaml(read_file(path, SPEC_LIMIT, follow_symlinks=False)), self.pool)
        except (OSError, DocumentError, SpecError) as error:
            why = reason(error) if isinstance(error, OSError) else str(error)
            log.error("%s: skipped, not a claim spec this driver can read: %s; left for the operator", path, why)
            return None

    def remove_orphans(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Remove the claim specs that claims do not hold (an unprepare cut short after the checkpoint write); a
        spec this driver cannot read is left alone."""
        for uid, path in claim_spec_files(self.cdi_dir):
            if uid in claims or self.read(uid, path) is None:
                continue
            with contextlib.suppress(OSError):
                path.unlink()
            log.info("removed %s: no prepared claim has it", path)
