"""The soak's simulated hardware: the simulated backend's devices file (health bits, XIDs, presence per chip, and the
chips whose reset lies: `reset: {lie: [...]}`), and an ixsmi stand-in (run where the chart runs `ixsmi -r`: the
reset-helper container, or a privileged agent's own) that keeps an append-only log of every reset (start and end,
with its exit status), which can be made to fail or to be slow.

The stand-in is as strict as the real ixsmi: without privilege (CAP_SYS_ADMIN in its effective set, and the PCI
drivers' folder writable, which `ixsmi -r` writes) it refuses, exit 1, and logs the refused run's end with that code,
so a chart that runs the reset where it cannot work shows in the log as failed resets."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from harness.plugin import Chip, bi_v150_chips

PCI_DRIVERS = "/sys/bus/pci/drivers"  # what `ixsmi -r` writes: writable only to a privileged container
IXSMI = """#!/bin/sh
# The soak's ixsmi: every run is logged, start and end; {mode} says how it behaves (ok, fail, slow <seconds>, hang).
log={log}
echo "$(date +%s.%N) start $$ $*" >> "$log"
# As strict as the real one: a reset needs CAP_SYS_ADMIN (bit 21 of CapEff) and a writable /sys/bus/pci/drivers.
caps=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)
if [ $(( (0x${{caps:-0}} >> 21) & 1 )) -ne 1 ] || [ ! -w {drivers} ]; then
  echo "$(date +%s.%N) end $$ 1 $*" >> "$log"
  echo "ixsmi: Permission denied: resetting a GPU needs privilege" >&2
  exit 1
fi
mode=$(cat {mode} 2>/dev/null)
case "$mode" in
  fail) echo "$(date +%s.%N) end $$ 1 $*" >> "$log"; echo "ixsmi: simulated failure" >&2; exit 1 ;;
  slow*) sleep "${{mode#slow }}" ;;
  hang) exec sleep 3600 ;;
esac
echo "$(date +%s.%N) end $$ 0 $*" >> "$log"
"""


@dataclass
class Hardware:
    """The node's 2 x BI-V150 as the simulated backend reads them; write() after each change."""

    directory: Path
    chips: list[Chip] = field(default_factory=bi_v150_chips)
    bits: dict[int, set[str]] = field(default_factory=dict)
    absent: set[int] = field(default_factory=set)
    xids: dict[int, list[int]] = field(default_factory=dict)  # sent to the running agent process, kept in the file
    sent: set[tuple[int, int]] = field(default_factory=set)
    # An agent process running when a new one was asked for (a rollout replaces it only once the DaemonSet
    # controller gets to it) -> the XIDs it had been sent, which it does not report again while it runs.
    earlier: dict[int, set[tuple[int, int]]] = field(default_factory=dict)
    lying: set[int] = field(default_factory=set)  # chips whose reset lies: ixsmi exits 0, the chip is not reset
    pci_drivers: str = PCI_DRIVERS  # the folder the stand-in must be able to write (a test names another)

    def __post_init__(self) -> None:
        # What the agent's pod reads (CoreX's folder, mounted read-only) and where the ixsmi stand-in writes (a
        # folder the pod mounts writable at the same path: the chart's node feature folder).
        self.corex, self.state = self.directory / "corex", self.directory / "state"
        self.corex.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        self.devices = self.corex / "soak-devices.yaml"
        self.ixsmi = self.corex / "ixsmi"
        self.reset_log = self.state / "resets.log"
        self.ixsmi_mode = self.state / "ixsmi.mode"
        self.ixsmi.write_text(IXSMI.format(log=self.reset_log, mode=self.ixsmi_mode, drivers=self.pci_drivers))
        self.ixsmi.chmod(0o755)
        self.reset_log.touch()
        self.set_ixsmi("ok")
        self.write()

    @property
    def uuids(self) -> list[str]:
        return [chip.uuid for chip in self.chips]

    @property
    def chip_of(self) -> dict[str, int]:
        """UUID -> the chip's index (its minor)."""
        return {uuid: index for index, uuid in enumerate(self.uuids)}

    def board_of(self, chip: int) -> set[int]:
        board = self.chips[chip].board
        return {c.minor for c in self.chips if c.board == board}

    def raise_xid(self, chip: int, xid: int, running: Sequence[int]) -> bool:
        """Report the XID (False: an agent process running now was already sent it; the backend sends each once in
        a process's life). `running`: the agent's processes now."""
        self.earlier = {pid: sent for pid, sent in self.earlier.items() if pid in running}
        if (chip, xid) in self.sent or any((chip, xid) in sent for sent in self.earlier.values()):
            return False
        self.sent.add((chip, xid))
        self.xids.setdefault(chip, []).append(xid)
        self.write()
        return True

    def agent_restarted(self, still_broken: dict[int, list[int]], running: Sequence[int]) -> None:
        """A new agent process: the XIDs the last one was sent are events of the past, not sent again, but those of
        chips still broken (not reset since) are reported again, as a broken chip goes on reporting. `running`: the
        agent's processes now, which may run on a while and still ignore what they were sent."""
        for pid in running:
            self.earlier[pid] = self.earlier.get(pid, set()) | self.sent
        self.xids = {chip: list(xids) for chip, xids in still_broken.items() if xids}
        self.sent = {(chip, xid) for chip, xids in self.xids.items() for xid in xids}
        self.write()

    def reset_healed(self, chip: int, still_broken: Sequence[int]) -> list[int]:
        """A reset healed the chip: its XIDs but `still_broken` (reported since the reset ended) leave the file, as a
        chip reset no longer reports them to a process that begins listening after; the ones that left. A process
        that was sent them keeps them in `sent`: it would not report them again while it runs."""
        kept = self.xids.get(chip, [])
        dropped = [xid for xid in kept if xid not in still_broken]
        if dropped:
            self.xids[chip] = [xid for xid in kept if xid in still_broken]
            self.write()
        return dropped

    def set_bit(self, chip: int, bit: str, on: bool) -> None:
        (self.bits.setdefault(chip, set()).add if on else self.bits.setdefault(chip, set()).discard)(bit)
        self.write()

    def set_present(self, chip: int, present: bool) -> None:
        (self.absent.discard if present else self.absent.add)(chip)
        self.write()

    def set_lying(self, chips: Sequence[int], lying: bool) -> None:
        """The chips' resets lie (the simulated backend's `reset: {lie: [...]}`: ixsmi exits 0, the chip is not reset
        and reports its XIDs again) or are honest again."""
        (self.lying.update if lying else self.lying.difference_update)(chips)
        self.write()

    def set_ixsmi(self, mode: str) -> None:
        self.ixsmi_mode.write_text(mode + "\n")

    def write(self) -> None:
        boards: dict[int, list[dict[str, object]]] = {}
        for chip in self.chips:
            entry: dict[str, object] = {
                "uuid": chip.uuid,
                "minor": chip.minor,
                "bus_id": f"0000:{0x8A + chip.minor:02x}:00.0",
                "numa_node": 0,
                "health": sorted(self.bits.get(chip.minor, ())),
            }
            if self.xids.get(chip.minor):
                entry["xids"] = list(self.xids[chip.minor])
            if chip.minor in self.absent:
                entry["present"] = False
            boards.setdefault(chip.board, []).append(entry)
        document: dict[str, object] = {"boards": [{"product": "BI-V150", "chips": boards[b]} for b in sorted(boards)]}
        if self.lying:
            document["reset"] = {"lie": [self.chips[chip].uuid for chip in sorted(self.lying)]}
        temporary = self.devices.with_name(f".{self.devices.name}.tmp")
        temporary.write_text(yaml.safe_dump(document, sort_keys=False))
        os.replace(temporary, self.devices)
