"""The configuration the planner and the servers act on: the ix-config settings, resolved and checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ix_device_plugin.settings.health import HealthPolicy
from ix_device_plugin.settings.table import default


@dataclass(frozen=True)
class Config:
    """The validated configuration: every ix-config setting, plus the health checks turned off."""

    resource_name: str = default("resource_name")
    splitboard: bool = default("splitboard")
    fail_on_init_error: bool = default("fail_on_init_error")
    reset_gpu: bool = default("reset_gpu")
    use_volcano: bool = default("use_volcano")
    device_list_strategy: tuple[str, ...] = default("device_list_strategy")
    replicas: int = default("replicas")
    rename_by_default: bool = default("rename_by_default")
    fail_requests_greater_than_one: bool = default("fail_requests_greater_than_one")
    self_healing: str = default("self_healing")  # auto, true or false
    reset_limit: int = default("reset_limit")  # resets of a chip within reset_window (0: no limit)
    reset_window: float = default("reset_window")  # seconds
    health_reset: tuple[str, ...] = default("health_reset")  # `XID 48`, `ECC`: moved to the action named
    health_operator: tuple[str, ...] = default("health_operator")
    health_ignore: tuple[str, ...] = default("health_ignore")
    reset_diagnostic: tuple[str, ...] = default("reset_diagnostic")  # run after a proven reset; () none
    reset_diagnostic_timeout: float = default("reset_diagnostic_timeout")
    # Health error names not to act on (IX_DISABLE_HEALTHCHECKS); "all" ignores every error and XID,
    # "xids" every XID event, "XID <n>" that XID (besides the application XIDs always ignored).
    ignored_health_errors: frozenset[str] = frozenset()
    # Where each value came from: "default", "file <path>", "env <NAME>" or "flag <--name>".
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def health_policy(self) -> HealthPolicy:
        """What is done about each XID and health error: the default table, health.*, IX_DISABLE_HEALTHCHECKS."""
        return HealthPolicy(
            frozenset(self.health_reset),
            frozenset(self.health_operator),
            frozenset(self.health_ignore),
            self.ignored_health_errors,
        )

    @property
    def shared(self) -> bool:
        """True when devices are advertised as several time-sliced replicas."""
        return self.replicas >= 2

    @property
    def advertised_resource_name(self) -> str:
        """The resource name the kubelet is told, `.shared` appended when renaming."""
        if self.shared and self.rename_by_default:
            return f"{self.resource_name}.shared"
        return self.resource_name
