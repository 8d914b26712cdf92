"""Per-claim settings: the opaque configuration `gpu.iluvatar.com/v1alpha1` `GpuConfig`, from a claim or its class.

Pure. A ResourceClaim carries it in `spec.devices.config[].opaque` (driver `gpu.iluvatar.com`), a DeviceClass in
`spec.config[].opaque`; the scheduler copies both into the allocation (`status.allocation.devices.config`, each
entry with its `source`, FromClass or FromClaim, and the `requests` it applies to). For each allocated device
the entries that apply to its request are laid over each other, the class's first and the claim's after, so
that a field the claim sets wins over the class's and a field it leaves out is the class's.

    apiVersion: gpu.iluvatar.com/v1alpha1
    kind: GpuConfig
    reset: true          # reset the device's chips (ixsmi -r) before the container starts
    sharing:
      shares: 2          # the shares of each shared device this request holds (checked at prepare)

Decoded strictly: an unknown field, a wrong type or another apiVersion or kind is an error naming the field,
and fails that claim's prepare. The checkpoint keeps what was decoded and reads it back leniently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ix_device_plugin.dra.slices import DRIVER

API_VERSION = f"{DRIVER}/v1alpha1"
KIND = "GpuConfig"
MAX_SHARES = 1024  # as sharing.timeSlicing.replicas
FROM_CLASS, FROM_CLAIM = "FromClass", "FromClaim"
_FIELDS = ("apiVersion", "kind", "reset", "sharing")
_SHARING_FIELDS = ("shares",)


class ConfigError(Exception):
    """A GpuConfig that cannot be used; the message names the entry and the field."""


@dataclass(frozen=True)
class GpuConfig:
    """What a claim asks of its devices; None: not said (the default applies)."""

    reset: bool | None = None
    shares: int | None = None

    def over(self, base: GpuConfig) -> GpuConfig:
        """This config laid over base: the fields set here win."""
        return GpuConfig(
            reset=base.reset if self.reset is None else self.reset,
            shares=base.shares if self.shares is None else self.shares,
        )

    @property
    def resets(self) -> bool:
        """True when the chips are to be reset before the container starts."""
        return self.reset is True

    def describe(self) -> str:
        """The fields set, for `list --dra` ("" when none)."""
        parts = [] if self.reset is None else [f"reset: {str(self.reset).lower()}"]
        if self.shares is not None:
            parts.append(f"sharing.shares: {self.shares}")
        return ", ".join(parts)


@dataclass(frozen=True)
class ConfigEntry:
    """One GpuConfig of the allocation, where it came from, and the requests it applies to (empty: all)."""

    source: str
    requests: tuple[str, ...]
    config: GpuConfig

    def applies_to(self, request: str) -> bool:
        """True for request, and for a subrequest (`<request>/<subrequest>`) of a request it names."""
        return not self.requests or request in self.requests or request.partition("/")[0] in self.requests


def decode(parameters: Any, where: str) -> GpuConfig:
    """The GpuConfig in an opaque entry's parameters; ConfigError naming the field when it is not one."""
    if not isinstance(parameters, dict):
        raise ConfigError(f"{where}: expected a {KIND} object, got {_kind(parameters)}")
    unknown = [str(name) for name in parameters if name not in _FIELDS]
    if unknown:
        raise ConfigError(f"{where}.{unknown[0][:64]}: unknown field ({KIND} has {', '.join(_FIELDS)})")
    if parameters.get("apiVersion") != API_VERSION:
        raise ConfigError(f"{where}.apiVersion: expected {API_VERSION}, got {_shown(parameters.get('apiVersion'))}")
    if parameters.get("kind") != KIND:
        raise ConfigError(f"{where}.kind: expected {KIND}, got {_shown(parameters.get('kind'))}")
    reset = parameters.get("reset")
    if reset is not None and not isinstance(reset, bool):
        raise ConfigError(f"{where}.reset: expected true or false, got {_shown(reset)}")
    return GpuConfig(reset=reset, shares=_shares(parameters.get("sharing"), f"{where}.sharing"))


def _shares(sharing: Any, where: str) -> int | None:
    if sharing is None:
        return None
    if not isinstance(sharing, dict):
        raise ConfigError(f"{where}: expected an object with {', '.join(_SHARING_FIELDS)}, got {_kind(sharing)}")
    unknown = [str(name) for name in sharing if name not in _SHARING_FIELDS]
    if unknown:
        raise ConfigError(f"{where}.{unknown[0][:64]}: unknown field (sharing has {', '.join(_SHARING_FIELDS)})")
    shares = sharing.get("shares")
    if shares is None:
        return None
    if isinstance(shares, bool) or not isinstance(shares, int) or not 1 <= shares <= MAX_SHARES:
        raise ConfigError(f"{where}.shares: expected an integer from 1 to {MAX_SHARES}, got {_shown(shares)}")
    return shares


def lenient(data: Any) -> GpuConfig:
    """The GpuConfig the checkpoint recorded: what is there and well typed, the rest unset."""
    if not isinstance(data, dict):
        return GpuConfig()
    reset, shares = data.get("reset"), data.get("shares")
    return GpuConfig(
        reset=reset if isinstance(reset, bool) else None,
        shares=shares if isinstance(shares, int) and not isinstance(shares, bool) else None,
    )


def allocation_configs(devices: Mapping[str, Any], where: str) -> list[ConfigEntry]:
    """This driver's config entries of an allocation (`status.allocation.devices`), the class's first; ConfigError."""
    listed = devices.get("config") or []
    if not isinstance(listed, list):
        raise ConfigError(f"{where}.config: expected a list, got {_kind(listed)}")
    entries: list[tuple[int, ConfigEntry]] = []
    for index, entry in enumerate(listed):
        here = f"{where}.config[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{here}: expected an object, got {_kind(entry)}")
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER:
            continue  # another driver's, or a kind of configuration this driver does not take
        source = entry.get("source")
        if source not in (FROM_CLASS, FROM_CLAIM):
            raise ConfigError(f"{here}.source: expected {FROM_CLASS} or {FROM_CLAIM}, got {_shown(source)}")
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ConfigError(f"{here}.requests: expected a list of request names")
        config = decode(opaque.get("parameters"), f"{here}.opaque.parameters")
        entries.append((0 if source == FROM_CLASS else 1, ConfigEntry(source, tuple(requests), config)))
    entries.sort(key=lambda pair: pair[0])  # stable: the list's order within each source
    return [entry for _, entry in entries]


def config_for(requests: Sequence[str], entries: Sequence[ConfigEntry]) -> GpuConfig:
    """The config of a device allocated for these requests: every entry that applies, later ones winning."""
    config = GpuConfig()
    for entry in entries:
        if any(entry.applies_to(request) for request in requests):
            config = entry.config.over(config)
    return config


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer"}
    return names.get(type(value), "null" if value is None else type(value).__name__)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."
