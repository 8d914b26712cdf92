"""Deliberately broken builds of the agent, for the checker's own tests on the real node: each break is one
plausible defect of the agent, patched into the chart's image at its start, with no image of its own.

This file is both sides. On the host, `install` copies it into the soak's simulated hardware folder (CoreX's folder,
which the agent's pod already mounts read-only) as `sitecustomize.py`, and gives the agent's container PYTHONPATH
naming that folder and SOAK_BREAKS naming the breaks (the chart's `extraEnv`). In the pod, Python imports it at
start (site.py imports any `sitecustomize` on the path), and it patches in the breaks SOAK_BREAKS names before the
agent's own code runs. It imports nothing of the agent at the top: the host has no need of it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FOLDER = "soak-breaks"  # in CoreX's folder
ENV = "SOAK_BREAKS"
LEAK_PER_READ = 5  # descriptors a read of the devices file leaks: past the bound within a short run


def visible_devices_one_short() -> None:
    """Device plugin: Allocate names in CoreX's variables one chip fewer than it gives (the last chip of a board
    left out of IX_VISIBLE_DEVICES and ILUVATAR_COREX_VISIBLE_DEVICES): "devices match"."""
    from ix_device_plugin.deviceplugin import service

    right = service._container_response

    def one_short(plan: Any, device_ids: list[str], index: int) -> Any:
        response = right(plan, device_ids, index)
        for name in ("IX_VISIBLE_DEVICES", "ILUVATAR_COREX_VISIBLE_DEVICES"):
            uuids = response.envs[name].split(",")
            if len(uuids) > 1:
                response.envs[name] = ",".join(uuids[:-1])
        return response

    service._container_response = one_short


def holder_always_free() -> None:
    """Device plugin: the chip guard's holder question answers "free" whatever pod-resources says, so a chip with an
    XID of the reset class is reset under the container that holds it: "no reset under a holder"."""
    from ix_device_plugin.deviceplugin.chipguard import PodHolders

    async def free(self: Any, uuid: str) -> str | None:
        return None

    PodHolders.holder = free  # type: ignore[method-assign]


def healed_never_listed() -> None:
    """Device plugin: a device once listed Unhealthy after being Healthy is listed Unhealthy for good, so a chip
    healed by its reset never comes back into allocatable: "back in service"."""
    from ix_device_plugin.api import UNHEALTHY
    from ix_device_plugin.deviceplugin import service

    right = service.list_response
    healthy_once: set[str] = set()
    out_for_good: set[str] = set()

    def sticky(plan: Any) -> Any:
        message = right(plan)
        for device in message.devices:
            if device.health != UNHEALTHY and device.ID not in out_for_good:
                healthy_once.add(device.ID)
            elif device.ID in healthy_once:
                out_for_good.add(device.ID)
            if device.ID in out_for_good:
                device.health = UNHEALTHY
        return message

    service.list_response = sticky


def devices_file_leaks() -> None:
    """Every read of the simulated devices file (each health poll, every 0.5 s) leaks open handles: "bounded"."""
    from ix_device_plugin.hardware import simulated

    right = simulated._read_bytes
    leaked: list[Any] = []

    def leaking(path: Path) -> bytes:
        leaked.extend(path.open("rb") for _ in range(LEAK_PER_READ))
        return right(path)

    simulated._read_bytes = leaking


def claim_spec_left() -> None:
    """DRA: unprepare forgets a claim (its checkpoint entry) but leaves its CDI spec file: "nothing left"."""
    from ix_device_plugin.dra.specfiles import ClaimSpecFiles

    def kept(self: Any, uid: str) -> None:
        return None

    ClaimSpecFiles.remove = kept  # type: ignore[method-assign]


BREAKS: dict[str, Callable[[], None]] = {
    "visible-devices-one-short": visible_devices_one_short,
    "holder-always-free": holder_always_free,
    "healed-never-listed": healed_never_listed,
    "devices-file-leaks": devices_file_leaks,
    "claim-spec-left": claim_spec_left,
}


def apply(names: str) -> None:
    """In the agent's process: patch in each break named (comma-separated); one that cannot be is said on stderr."""
    for name in filter(None, names.split(",")):
        try:
            BREAKS[name]()
            print(f"soak break applied: {name}", file=sys.stderr)
        except Exception as error:  # the agent still starts; the self-test then fails to see the violation
            print(f"soak break {name} not applied: {type(error).__name__}: {error}", file=sys.stderr)


def write(folder: Path) -> Path:
    """This file, as the sitecustomize.py of folder (made if need be)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "sitecustomize.py"
    shutil.copyfile(Path(__file__), target)
    return target


def install(agent: Any, names: Sequence[str]) -> None:
    """Make the agent's next install (its chart values) run with the breaks named: the file in the simulated
    hardware's CoreX folder, PYTHONPATH (that folder where each of the agent's pods mounts it) and SOAK_BREAKS in the
    environment of the device plugin's and the DRA driver's containers."""
    unknown = [name for name in names if name not in BREAKS]
    assert not unknown, f"no such break: {unknown}; known: {sorted(BREAKS)}"
    write(agent.hardware.corex / FOLDER)

    def environment(corex: Path) -> list[dict[str, str]]:
        return [{"name": "PYTHONPATH", "value": str(corex / FOLDER)}, {"name": ENV, "value": ",".join(names)}]

    agent.extra_env = environment


if os.environ.get(ENV) and __name__ == "sitecustomize":
    apply(os.environ[ENV])
