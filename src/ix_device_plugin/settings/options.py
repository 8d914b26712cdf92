"""What each front end is given: plain values, already checked.

The backend is named by its kind here and built in hardware/; how to reach the API server is derived from these
values by apiserver/.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.configfile import load_file
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import Given, Resolved, config_from
from ix_device_plugin.settings.table import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_DEV_ROOT,
    DEFAULT_KUBELET_PLUGINS_DIR,
    DEFAULT_PLUGIN_DIR,
    DEFAULT_REGISTRAR_DIR,
    DEFAULT_SYSFS_ROOT,
    DEFAULT_VOLCANO_FIELD_MANAGER,
    DRA,
    NODE_CONFIG_LABEL,
    RUN,
    default,
)


@dataclass(frozen=True)
class NodeOptions:
    """What both front ends need: the GPUs and how to watch them, the config file, probes, timings, and the
    node services (labels, telemetry).

    Fields default to the command line's defaults, except that nothing is written to the node (CDI spec,
    feature file) unless a directory is given, and telemetry is off unless an interval is given.
    """

    mode: str = RUN  # which settings of the config file are used
    backend: str = default("backend")  # "ixml" or "simulated"
    simulated_devices: str = default("simulated_devices")
    ixml_library: str | None = None
    ixsmi_path: str = default("ixsmi_path")
    dev_root: Path = Path(DEFAULT_DEV_ROOT)
    sysfs_root: Path = Path(DEFAULT_SYSFS_ROOT)
    cdi_spec_dir: Path | None = None  # None: no CDI spec is written
    node_feature_dir: Path | None = None  # None: no NFD feature file is written
    telemetry_interval: float | None = None  # None: no GPU telemetry
    pod_resources_socket: Path | None = None  # None: telemetry without pod labels
    kubelet_plugins_directory_path: Path | None = None  # None: no node-health record (device plugin; dra: its own)
    health_interval: float = default("health_interval")
    backend_timeout: float | None = None  # None: 3 health intervals, at least 10 s
    health_address: str = default("health_address")
    config_path: Path = Path(DEFAULT_CONFIG_PATH)
    config_required: bool = False  # a named file must exist; the default path may be absent
    given: Given = field(default_factory=dict)  # ix-config settings given as flags or variables
    ignored_health_errors: frozenset[str] = frozenset()  # IX_DISABLE_HEALTHCHECKS
    rediscover_interval: float = 60.0
    stop_timeout: float = 1.5  # shutdown abandons what has not stopped by then
    reset_wait_timeout: float = default("reset_wait_timeout")
    reset_timeout: float = default("reset_timeout")
    reset_via: str = default("reset_via")  # who runs ixsmi -r: helper, local, none, auto
    reset_helper_socket: Path | None = None  # the reset helper's socket (None: none named)
    device_access: str | None = None  # IX_DEVICE_ACCESS: how the chart gives the GPU nodes (None: not shown)
    device_access_fallback: str = "none"  # what a node whose nodes cannot be opened becomes (privileged, none)
    nri_status: Path | None = None  # the NRI injector's status file
    device_access_label: bool = True  # the Node's label iluvatar.com/gpu.device-access (with device_access)

    @property
    def call_timeout(self) -> float:
        """The deadline of one backend call."""
        if self.backend_timeout is not None:
            return self.backend_timeout
        return max(3 * self.health_interval, 10.0)

    @property
    def health_stale_after(self) -> float:
        """/healthz fails when the last successful health poll is older than this."""
        return self.call_timeout + 2 * self.health_interval


@dataclass(frozen=True)
class Options(NodeOptions):
    """The device plugin's options (and `list`'s and `cdi generate`'s)."""

    plugin_dir: Path = Path(DEFAULT_PLUGIN_DIR)
    poll_interval: float = 1.0  # stat check when inotify wakes us; polling alone uses a quarter
    registration_grace: float = 60.0  # /healthz fails after registration has failed this long
    node_name: str = ""  # for metric labels: NODE_NAME, else the host name
    per_node_config: bool = False  # the node label NODE_CONFIG_LABEL picks the ConfigMap key
    label_wait: float = 5.0  # at start, how long to wait for the node label before using ix-config
    pod_uid: str = ""  # POD_UID: names the socket per pod, so that an update overlaps the old pod
    zero_downtime_upgrade: str = "auto"  # register beside another pod serving the node: auto, true or false
    volcano_field_manager: str = DEFAULT_VOLCANO_FIELD_MANAGER  # whose Volcano annotations are believed


@dataclass(frozen=True)
class DraOptions:
    """What the DRA mode needs: the node's options plus the kubelet's directories and the node name."""

    base: NodeOptions
    node_name: str
    registrar_dir: Path = Path(DEFAULT_REGISTRAR_DIR)
    plugins_dir: Path = Path(DEFAULT_KUBELET_PLUGINS_DIR)
    claim_read_timeout: float = 10.0  # how long one NodePrepareResources retries reading a claim
    config: Config = field(default_factory=Config)  # the ix-config settings DRA uses, as read at start
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")  # tells a reboot from a restart
    pod_uid: str = ""  # POD_UID: names the sockets per pod, so that an update overlaps the old driver

    @property
    def cdi_spec_dir(self) -> Path:
        """Where claim CDI specs go (--cdi-spec-dir; `off` is refused for DRA)."""
        assert self.base.cdi_spec_dir is not None
        return self.base.cdi_spec_dir


def _node_fields(resolved: Resolved) -> dict[str, Any]:
    """NodeOptions' fields from the settings the mode takes (the others keep their defaults)."""
    values = dict(resolved.values)
    if "disabled_healthchecks" in values:
        values["ignored_health_errors"] = values["disabled_healthchecks"]
    if "config" in values:
        values["config_path"] = values["config"] or Path(DEFAULT_CONFIG_PATH)
        values["config_required"] = values["config"] is not None
    chosen = {f.name: values[f.name] for f in fields(NodeOptions) if f.name in values}
    return {**chosen, "mode": resolved.mode, "given": resolved.given}


def node_options_from(resolved: Resolved) -> NodeOptions:
    """The node's options from resolved settings; SettingsError for settings that cannot go together."""
    options = NodeOptions(**_node_fields(resolved))
    check_given(options)
    return options


def options_from(resolved: Resolved) -> Options:
    """The device plugin's options from resolved settings; SettingsError as node_options_from."""
    values = resolved.values
    plugin = {
        "plugin_dir": values.get("device_plugin_path", Path(DEFAULT_PLUGIN_DIR)),
        "node_name": values.get("node_name") or socket.gethostname(),
        "per_node_config": values.get("per_node_config", False),
        "pod_uid": values.get("pod_uid") or "",
        "zero_downtime_upgrade": values.get("zero_downtime_upgrade", "auto"),
        "volcano_field_manager": values.get("volcano_field_manager", DEFAULT_VOLCANO_FIELD_MANAGER),
    }
    options = Options(**_node_fields(resolved), **plugin)
    check_given(options)
    return options


def dra_options_from(resolved: Resolved) -> DraOptions:
    """The DRA mode's options from resolved settings; SettingsError naming what is missing or wrong."""
    base = node_options_from(resolved)
    node = resolved["node_name"]
    if resolved.mode == DRA:
        if not node:
            raise SettingsError(["dra needs the node name: give --node-name or NODE_NAME (downward API spec.nodeName)"])
        if base.cdi_spec_dir is None:
            raise SettingsError(["dra writes a CDI spec per claim: --cdi-spec-dir (IX_CDI_SPEC_DIR) must not be off"])
    return DraOptions(
        base=base,
        node_name=node or socket.gethostname(),  # `list --dra` needs no name: a placeholder
        registrar_dir=resolved["kubelet_registrar_directory_path"],
        plugins_dir=resolved["kubelet_plugins_directory_path"],
        pod_uid=resolved.values.get("pod_uid") or "",
    )


def check_given(options: NodeOptions) -> None:
    """Check the ix-config settings given as flags and variables alone (before any file); SettingsError."""
    config_from(None, options.given, options.ignored_health_errors, options.mode)


def config_file_for(options: Options, key: str | None) -> tuple[Path, str]:
    """The config file to read when the node label names key (None: no label), and why, for logs and `list`."""
    base = options.config_path
    if not options.per_node_config:
        return base, f"{base}"
    if key is None:
        return base, f"{base} (node label {NODE_CONFIG_LABEL} not set)"
    named = base.parent / key
    if "/" in key or key.startswith(".") or not _is_file(named):
        return base, f"{base} (node label {NODE_CONFIG_LABEL}={key}: no such key in {base.parent})"
    return named, f"{named} (node label {NODE_CONFIG_LABEL}={key})"


def _is_file(path: Path) -> bool:
    """True for a file at path; False for anything else, and for a name no file can have (too long, a NUL)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def load_config(options: NodeOptions, path: Path | None = None) -> tuple[Config, tuple[str, ...]]:
    """The effective configuration (from path, default the configured file) and what to warn about: keys
    accepted but not acted on, and keys of settings this mode does not use. Raises SettingsError."""
    path = options.config_path if path is None else path
    file = None
    if path.exists() or options.config_required:
        file = load_file(path, options.mode)
    config = config_from(file, options.given, options.ignored_health_errors, options.mode)
    if file is None:
        return config, ()
    warnings = file.warnings
    if file.unused:
        warnings += (f"{path}: keys {options.mode} does not use, ignored: {', '.join(file.unused)}",)
    return config, warnings
