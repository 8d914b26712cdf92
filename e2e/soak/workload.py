"""The soak's DRA workload: pods and ResourceClaims of every shape the driver serves without a config of its own.

- `claim-1`, `claim-2`: one claim of one chip, or of two chips (DeviceClass gpu.iluvatar.com);
- `claims-2`: two claims of a chip each in one container;
- `requests-2`: one claim with two requests of a chip each;
- `board-1`: one claim of a whole board (DeviceClass board.gpu.iluvatar.com: both chips of one board);
- `shared-claim`: two pods naming one claim (the sharing a claim gives: both see its chip);
- `admin-1`: a claim of one chip with admin access (a monitoring pod: the namespace carries the label
  resource.kubernetes.io/admin-access=true that DRAAdminAccess asks for).

Time-sliced shares (consumable capacity: the driver's `sharing.timeSlicing.replicas`, draconfig.py), of the class
whose devices the config in force shares (`unit`: chips with splitboard, whole boards without):

- `share-1`: a claim of one share;
- `shares-2`: a claim asking for 2 shares (`capacity.requests.shares`: a device of 2 shares, alone);
- `share-pair`: two pods, each with a claim of one share of its own (the scheduler puts them on one device
  when it can: their slots must differ).

A shape the config in force cannot serve stays Pending (a chip claim while only boards are offered, 2 shares of
a device held whole). Every object of a pod `<name>` is named `<name>-...`, so that deleting a pod deletes what it
made.
"""

from __future__ import annotations

from typing import Any

from harness.dra import DRIVER, claim
from harness.pods import STAY, busybox_pod

ADMIN_LABEL = "resource.kubernetes.io/admin-access"
SECOND_POD = "-b"  # the suffix of shared-claim's second pod


def objects(name: str, shape: str, unit: str = DRIVER) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(claims, pods) of a DRA workload of this shape; `unit`: the DeviceClass a share shape claims of."""
    if shape == "share-pair":
        claims = [claim(f"{name}-c{index}", device_class=unit) for index in range(2)]
        pods = [
            busybox_pod(pod, STAY, claims=[{"name": "c0", "resourceClaimName": made["metadata"]["name"]}])
            for pod, made in zip((name, name + SECOND_POD), claims, strict=True)
        ]
        return claims, pods
    if shape in ("share-1", "shares-2"):
        claims = [claim(f"{name}-c0", device_class=unit, shares=2 if shape == "shares-2" else None)]
    elif shape == "shared-claim":
        refs = [{"name": "c0", "resourceClaimName": f"{name}-c0"}]
        pods = [busybox_pod(pod, STAY, claims=refs) for pod in (name, name + SECOND_POD)]
        return [claim(f"{name}-c0")], pods
    elif shape == "requests-2":
        made = claim(f"{name}-c0")
        request = made["spec"]["devices"]["requests"][0]
        made["spec"]["devices"]["requests"] = [request, {**request, "name": "gpu2"}]
        claims = [made]
    elif shape == "board-1":
        claims = [claim(f"{name}-c0", device_class=f"board.{DRIVER}")]
    elif shape == "admin-1":
        claims = [claim(f"{name}-c0", admin_access=True)]
    elif shape == "claims-2":
        claims = [claim(f"{name}-c{index}") for index in range(2)]
    else:
        claims = [claim(f"{name}-c0", count=2 if shape == "claim-2" else 1)]
    refs = [{"name": f"c{index}", "resourceClaimName": c["metadata"]["name"]} for index, c in enumerate(claims)]
    return claims, [busybox_pod(name, STAY, claims=refs)]


def pods_of(name: str) -> list[str]:
    """Every pod a workload `name` may have made."""
    return [name, name + SECOND_POD]


def claims_of(name: str) -> list[str]:
    return [f"{name}-c0", f"{name}-c1"]


def chips_of(device: str, board_of: Any) -> set[int]:
    """The chips a device of the driver's slice is: `gpu-<minor>` one, `board-<minor>` its board's."""
    kind, _, minor = device.partition("-")
    if not minor.isdigit() or kind not in ("gpu", "board"):
        return set()
    return {int(minor)} if kind == "gpu" else set(board_of(int(minor)))
