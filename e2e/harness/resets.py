"""GPU resets as the chart runs them: an ixsmi stand-in as strict as CoreX's (it needs privilege: CAP_SYS_ADMIN and
a writable /sys/bus/pci/drivers, else it refuses), installed where the chart's reset helper runs it
(<corexPath>/bin/ixsmi), logging every run to a folder of the test's own that the chart mounts into the helper alone
(resetHelper.extraVolumes); and the Node Events a scenario reads."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .kube import Kubectl, Obj
from .plugin import Chip, devices_yaml, node_events

# Its exit status and words as ixsmi's without privilege; each run's arguments after `ran` or `refused`.
IXSMI = """#!/bin/sh
caps=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)
if [ $(( 0x$caps >> 21 & 1 )) -ne 1 ] || [ ! -w /sys/bus/pci/drivers ]; then
  echo "refused $*" >> {log}
  echo "ixsmi: Permission denied: resetting a GPU needs privilege" >&2
  exit 1
fi
echo "ran $*" >> {log}
"""


class ResetLog:
    """The stand-in ixsmi under workdir/corex/bin and the log of its runs."""

    def __init__(self, workdir: Path) -> None:
        self.folder = workdir / "ixsmi-runs"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o777)
        self.log = self.folder / "runs"
        ixsmi = workdir / "corex" / "bin" / "ixsmi"
        ixsmi.parent.mkdir(parents=True, exist_ok=True)
        ixsmi.write_text(IXSMI.format(log=self.log))
        ixsmi.chmod(0o755)

    def runs(self) -> list[str]:
        """Each run's outcome and arguments: `ran -r -i <uuid>`, `refused -r -i <uuid>`."""
        return self.log.read_text().splitlines() if self.log.exists() else []

    def values(self) -> dict[str, Any]:
        """The chart's values that mount the log's folder into the reset helper, at the same path."""
        folder = str(self.folder)
        return {
            "resetHelper": {
                "extraVolumes": [{"name": "ixsmi-runs", "hostPath": {"path": folder, "type": "Directory"}}],
                "extraVolumeMounts": [{"name": "ixsmi-runs", "mountPath": folder}],
            }
        }


def devices_with(chips: Iterable[Chip], reset: dict[str, list[str]] | None = None) -> str:
    """The simulated devices file of chips, with the reset: mapping (lie, vanish, fail, new_uuid) when given."""
    document = yaml.safe_load(devices_yaml(list(chips)))
    if reset:
        document["reset"] = reset
    return yaml.safe_dump(document, sort_keys=False)


def new_events(admin: Kubectl, node: str, reason: str, chip: Chip, before: Iterable[Obj]) -> list[Obj]:
    """The agent's Node Events of reason naming chip, but those of before (Events outlive the pods that wrote them)."""
    seen = {event["metadata"]["name"] for event in before}
    return [
        event
        for event in node_events(admin, node)
        if event["reason"] == reason and chip.uuid in event["message"] and event["metadata"]["name"] not in seen
    ]
