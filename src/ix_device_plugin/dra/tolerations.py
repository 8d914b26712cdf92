"""Device tolerations of a claim's allocation: read from its results, and matched to device taints as Kubernetes does.

Pure. An allocation result (resource.k8s.io/v1 DeviceRequestAllocationResult) carries a copy of its request's
tolerations, taken when the device was allocated. A toleration tolerates a taint when its effect is empty or the
taint's, its key is empty or the taint's, and its operator is `Exists`, or `Equal` (the default) with the taint's
value; any other operator tolerates nothing (k8s.io/dynamic-resource-allocation resourceclaim.ToleratesTaint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ix_device_plugin.dra.prepared import ClaimError

EXISTS, EQUAL = "Exists", "Equal"
_TEXT_FIELDS = ("key", "operator", "value", "effect")


@dataclass(frozen=True)
class Toleration:
    """One DeviceToleration (seconds: tolerationSeconds, which only NoExecute taints use; None when not set)."""

    key: str = ""
    operator: str = EQUAL
    value: str = ""
    effect: str = ""
    seconds: int | None = None

    def tolerates(self, taint: Mapping[str, str]) -> bool:
        """True when this toleration tolerates taint (a device taint: key, value, effect)."""
        if self.effect and self.effect != taint.get("effect", ""):
            return False
        if self.key and self.key != taint.get("key", ""):
            return False
        if self.operator in ("", EQUAL):
            return self.value == taint.get("value", "")
        return self.operator == EXISTS


def read_tolerations(value: Any, where: str) -> tuple[Toleration, ...]:
    """The tolerations of an allocation result (value: its `tolerations`, absent or null for none); ClaimError
    starting with where when they are not a list of DeviceToleration objects."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ClaimError(f"{where}: tolerations is not a list")
    return tuple(_toleration(item, f"{where}: tolerations[{index}]") for index, item in enumerate(value))


def _toleration(item: Any, where: str) -> Toleration:
    if not isinstance(item, dict):
        raise ClaimError(f"{where} is not an object")
    texts: dict[str, str] = {}
    for name in _TEXT_FIELDS:
        text = item.get(name)
        if text is not None and not isinstance(text, str):
            raise ClaimError(f"{where}.{name} is not a string")
        texts[name] = text or ""
    seconds = item.get("tolerationSeconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
        raise ClaimError(f"{where}.tolerationSeconds is not a whole number")
    return Toleration(texts["key"], texts["operator"] or EQUAL, texts["value"], texts["effect"], seconds)


def untolerated(taints: Sequence[Mapping[str, str]], tolerations: Sequence[Toleration]) -> list[Mapping[str, str]]:
    """The taints no toleration tolerates, in order."""
    return [taint for taint in taints if not any(toleration.tolerates(taint) for toleration in tolerations)]


def taint_text(taint: Mapping[str, str]) -> str:
    """taint as kubectl writes one: `key=value:effect` (`key:effect` without a value)."""
    value = taint.get("value")
    return f"{taint.get('key', '')}{'=' + value if value else ''}:{taint.get('effect', '')}"
