"""Node Feature Discovery's local feature source, modelled for the end-to-end node (NFD is not part of the cluster
built here): the feature files of a directory become the Node's labels, as nfd-worker reads them and nfd-master
applies them.

Rules as NFD (v0.14 and later) reads `features.d`: files whose name starts with a dot are skipped; a line is
`name=value` (`name` alone is `true`); lines starting with `#` are comments, `# +expiry-time=<RFC 3339>` ignores
the lines after it once that time has passed; a later file overrides an earlier one's label. Only labels in the
namespaces nfd-master is told about (`extraLabelNs`) are applied; labels that left the files are removed from the
Node. nfd-worker looks again at every change of the directory (at most once a second) and at least every
sleep interval; this model looks every `interval` seconds, which covers both.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from .kube import Kubectl

EXPIRY = "# +expiry-time="


def feature_labels(directory: Path, now: datetime | None = None) -> dict[str, str]:
    """The labels NFD's local source reads from directory's feature files now."""
    now = now or datetime.now(UTC)
    labels: dict[str, str] = {}
    files = sorted(directory.iterdir()) if directory.is_dir() else []
    for path in files:
        if path.name.startswith(".") or not path.is_file():
            continue
        expired = False
        for raw in path.read_text(errors="replace").splitlines():
            line = raw.strip()
            if line.startswith(EXPIRY):
                expiry = datetime.fromisoformat(line.removeprefix(EXPIRY).strip().replace("Z", "+00:00"))
                expired = expiry < now
                continue
            if not line or line.startswith("#") or expired:
                continue
            name, _, value = line.partition("=")
            labels[name] = value if "=" in line else "true"
    return labels


class NfdLocalSource:
    """Keeps the Node's labels in step with a feature directory, in a thread of its own, until stopped."""

    def __init__(
        self,
        admin: Kubectl,
        node: str,
        directory: Path,
        namespaces: Iterable[str] = ("iluvatar.com",),
        interval: float = 1.0,
    ) -> None:
        self.admin, self.node, self.directory = admin, node, directory
        self.namespaces = tuple(namespaces)
        self.interval = interval
        self.applied: dict[str, str] = {}  # what this model put on the Node
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nfd-local", daemon=True)

    def start(self) -> NfdLocalSource:
        self.sync()
        self._thread.start()
        return self

    def stop(self, remove_labels: bool = True) -> None:
        """Stop; remove the labels it applied (NFD uninstalled)."""
        self._stop.set()
        self._thread.join(10)
        if remove_labels and self.applied:
            self._patch({name: None for name in self.applied})
            self.applied = {}

    def sync(self) -> None:
        """Apply the files' labels now; remove those that left them."""
        wanted = {
            name: value
            for name, value in feature_labels(self.directory).items()
            if name.partition("/")[0] in self.namespaces
        }
        if wanted == self.applied:
            return
        patch: dict[str, str | None] = {name: None for name in self.applied if name not in wanted}
        patch.update(wanted)
        self._patch(patch)
        self.applied = wanted

    def _patch(self, labels: dict[str, str | None]) -> None:
        body = json.dumps({"metadata": {"labels": labels}})
        self.admin("patch", "node", self.node, "--type=merge", "-p", body)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except AssertionError as error:  # kubectl failed: try again at the next look
                self.errors.append(str(error)[:500])
