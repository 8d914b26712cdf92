"""Every setting in one table: its flag, environment variable, config-file key, default, parser and modes.

A mode takes exactly the settings listed for it; adding one to a mode is one word here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ix_device_plugin.settings import values as v
from ix_device_plugin.settings.devicelist import DEFAULT_DEVICE_LIST_STRATEGY, strategy_setting
from ix_device_plugin.settings.health import parse_disabled_healthchecks, parse_health_names, parse_self_healing

# The modes: the commands that take settings (`check-config` takes none).
RUN, LIST, CDI_GENERATE, DEMO, DRA, LIST_DRA = "run", "list", "cdi generate", "demo", "dra", "list --dra"
RESET_HELPER = "reset-helper"  # the privileged helper that runs `ixsmi -r` for the unprivileged agent
MODES = (RUN, LIST, CDI_GENERATE, DEMO, DRA, LIST_DRA, RESET_HELPER)
DEVICE_PLUGIN_MODES = frozenset({RUN, LIST, CDI_GENERATE, DEMO})
DRA_MODES = frozenset({DRA, LIST_DRA})

DEFAULT_CONFIG_PATH = "/ixconfig/ix-config"
DEFAULT_RESOURCE_NAME = "iluvatar.com/gpu"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_SIMULATED_DEVICES = "BI-V150:2"
DEFAULT_DEV_ROOT, DEFAULT_SYSFS_ROOT = "/", "/sys"
DEFAULT_IXSMI = "/usr/local/corex/bin/ixsmi"  # CoreX's tool; resets chips for flags.reset_gpu
DEFAULT_RESET_HELPER_SOCKET = "/run/ix-reset/reset.sock"
MAX_RESETS_PER_MINUTE = 600
NODE_CONFIG_LABEL = "iluvatar.com/device-plugin.config"
# Volcano's scheduler (the vc-scheduler binary) patches pod annotations naming no field manager: the API server
# records the program name its client-go user agent starts with.
DEFAULT_VOLCANO_FIELD_MANAGER = "vc-scheduler"
RESET_PATHS = ("auto", "helper", "local", "none")
LOG_LEVELS = ("debug", "info", "warning", "error")
# How a DaemonSet gives the agent's container the GPU device nodes, and what a node that cannot becomes
# (core/deviceaccess.py; settings import nothing of ours but themselves).
DEVICE_ACCESS_DEPLOYED = ("nri", "runtime", "privileged")
DEVICE_ACCESS_FALLBACKS = ("privileged", "none")
# Variables the platform or a shell sets for other programs too: not reported when a mode does not use them.
AMBIENT_ENV = frozenset({"NODE_NAME", "KUBECONFIG"})


@dataclass(frozen=True)
class Setting:
    """One configurable value: where it can be given, how it is parsed, and which modes use it."""

    name: str  # the attribute name: options.<name>, Config.<name>
    flag: str | None
    env: str | None
    key: str | None  # its key path in the ix-config file
    default: Any
    parse: v.Parser
    metavar: str
    help: str
    modes: frozenset[str]
    # The spellings of Iluvatar's plugin 4.4.0 (cmd/main.go), read beside ours with 4.4.0's meaning: its
    # command-line flags (Go's flag package takes `-name` and `--name`) and its environment variable.
    upstream_flags: tuple[str, ...] = ()
    upstream_env: str | None = None
    # (mode, default) where a mode's default differs from `default`: one setting, one meaning, another default
    mode_defaults: tuple[tuple[str, Any], ...] = ()

    def default_in(self, mode: str | None) -> Any:
        """The default of this setting in mode (None: the common one)."""
        return dict(self.mode_defaults).get(mode, self.default) if mode is not None else self.default

    @property
    def boolean(self) -> bool:
        """True for a true/false setting (its flag may be given without a value)."""
        return self.parse is v.parse_bool

    @property
    def flag_is_upstream(self) -> bool:
        """True where our flag is one of 4.4.0's spellings too (`--splitboard`: Go's flag package takes `-splitboard`
        and `--splitboard` alike), so that it is read as 4.4.0 reads it."""
        return self.flag is not None and self.flag in {f"--{name.lstrip('-')}" for name in self.upstream_flags}

    def used_by(self, mode: str | None) -> bool:
        """True when mode takes this setting (None: any mode, as `check-config` reads a file)."""
        return mode is None or mode in self.modes

    def owner(self, mode: str) -> str:
        """Whose setting this is, for a message saying that mode does not use it."""
        if self.modes <= DRA_MODES and mode not in DRA_MODES:
            return "a DRA setting"
        if self.modes <= DEVICE_PLUGIN_MODES and mode in DRA_MODES:
            return "a device plugin setting"
        return f"used by {', '.join(other for other in MODES if other in self.modes)}"


def _modes(*modes: str) -> frozenset[str]:
    return frozenset(modes)


HARDWARE = _modes(RUN, LIST, CDI_GENERATE, DRA, LIST_DRA, RESET_HELPER)  # what discovery needs
DAEMONS = _modes(RUN, DRA)
PLUGIN_CONFIG = _modes(RUN, LIST)  # ix-config settings of the device plugin
EVERY_MODE = frozenset(MODES)
HEALTH_MODES = _modes(*PLUGIN_CONFIG, *DRA_MODES)  # the health policy: both front ends, and what `list` shows


def _setting(
    name: str, flag: str | None, env: str | None, default: Any, parse: v.Parser, metavar: str, help: str,
    modes: Iterable[str], key: str | None = None, upstream: tuple[str, ...] = (), upstream_env: str | None = None,
    mode_defaults: tuple[tuple[str, Any], ...] = (),
) -> Setting:  # fmt: skip
    return Setting(
        name, flag, env, key, default, parse, metavar, help, frozenset(modes), upstream, upstream_env, mode_defaults
    )


SETTINGS: tuple[Setting, ...] = (
    # ---- node and daemon ----
    _setting("config", "--config", "IX_CONFIG", None, v.path, "PATH",
             f"config file (default {DEFAULT_CONFIG_PATH}; absent means defaults, a named file must exist)",
             (RUN, LIST, DEMO, DRA, LIST_DRA)),
    _setting("device_plugin_path", "--device-plugin-path", "IX_DEVICE_PLUGIN_PATH", Path(DEFAULT_PLUGIN_DIR),
             v.path, "DIR", "kubelet device plugin directory (list: where the plugin's health story is)", (RUN, LIST)),
    _setting("backend", "--backend", "IX_BACKEND", "ixml", v.choice("ixml", "simulated"), "ixml|simulated",
             "GPU source", HARDWARE),
    _setting("simulated_devices", "--simulated-devices", "IX_SIMULATED_DEVICES", DEFAULT_SIMULATED_DEVICES,
             v.text, "SPEC|PATH", "simulated boards: `BI-V150:2,BI-V100:1` or a YAML file", (*HARDWARE, DEMO)),
    _setting("ixml_library", "--ixml-library", "IX_IXML_LIBRARY", None, v.text, "PATH",
             "path of libixml.so (default: search the CoreX directories)", HARDWARE),
    _setting("dev_root", "--dev-root", "IX_DEV_ROOT", Path(DEFAULT_DEV_ROOT), v.path, "DIR",
             "directory holding the host's /dev", HARDWARE),
    _setting("sysfs_root", "--sysfs-root", "IX_SYSFS_ROOT", Path(DEFAULT_SYSFS_ROOT), v.path, "DIR",
             "host sysfs, for NUMA nodes and PCIe roots (reset-helper: also the driver directory a reset writes)",
             HARDWARE),
    _setting("cdi_spec_dir", "--cdi-spec-dir", "IX_CDI_SPEC_DIR", Path("/var/run/cdi"), v.path_or_off, "DIR|off",
             "where the CDI specs for the node's chips (dra: for each claim) are written; `off` disables (not in dra)",
             DAEMONS),
    _setting("node_feature_dir", "--node-feature-dir", "IX_NODE_FEATURE_DIR",
             Path("/etc/kubernetes/node-feature-discovery/features.d"), v.path_or_off, "DIR|off",
             "where the NFD feature file with the node's GPU labels is written; `off` disables", DAEMONS),
    _setting("health_interval", "--health-interval", "IX_HEALTH_INTERVAL", 5.0, v.seconds, "SECONDS",
             f"seconds between health polls ({v.MIN_INTERVAL:g} to {v.MAX_INTERVAL:g})", DAEMONS),
    _setting("telemetry_interval", "--telemetry-interval", "IX_TELEMETRY_INTERVAL", 15.0, v.seconds_or_off,
             "SECONDS|off", "seconds between GPU telemetry passes (ix-exporter's metrics on /metrics); `off` disables",
             DAEMONS),
    _setting("pod_resources_socket", "--pod-resources-socket", "IX_POD_RESOURCES_SOCKET",
             Path("/var/lib/kubelet/pod-resources/kubelet.sock"), v.path_or_off, "PATH|off",
             "the kubelet's pod-resources socket, to label GPU metrics with the pod holding the GPU; `off` disables",
             (RUN, LIST, DRA)),
    _setting("per_node_config", "--per-node-config", "IX_PER_NODE_CONFIG", False, v.parse_bool, "true|false",
             f"pick the ConfigMap key named by the node label {NODE_CONFIG_LABEL} (needs NODE_NAME and API access)",
             (RUN, LIST)),
    _setting("kubeconfig", "--kubeconfig", "KUBECONFIG", None, v.text, "PATH",
             "kubeconfig for features that use the API server (default: the in-cluster service account)",
             (RUN, LIST, DRA)),
    _setting("node_name", "--node-name", "NODE_NAME", None, v.text, "NAME",
             "the node this runs on (dra: required; run: for API features and metric labels, default the host name)",
             (RUN, LIST, DRA, LIST_DRA)),
    _setting("backend_timeout", "--backend-timeout", "IX_BACKEND_TIMEOUT", None, v.seconds, "SECONDS",
             "deadline of one GPU library call (default: 3 health intervals, at least 10 s)", DAEMONS),
    _setting("ixsmi_path", "--ixsmi-path", "IX_IXSMI_PATH", DEFAULT_IXSMI, v.text, "PATH",
             "ixsmi, which resets chips for flags.reset_gpu (dra: for claims configured with reset: true; "
             "reset-helper: for the agent)", (RUN, DRA, RESET_HELPER)),
    _setting("reset_wait_timeout", "--reset-wait-timeout", "IX_RESET_WAIT_TIMEOUT", 60.0, v.seconds, "SECONDS",
             "GPU reset: how long to wait for other IXML users (ix-exporter) to let go, and to come back",
             (RUN, DRA)),
    _setting("reset_timeout", "--reset-timeout", "IX_RESET_TIMEOUT", 120.0, v.seconds, "SECONDS",
             "GPU reset: how long `ixsmi -r` may take", (RUN, DRA, RESET_HELPER)),
    _setting("reset_via", "--reset-via", "IX_RESET_VIA", "auto", v.choice(*RESET_PATHS), "|".join(RESET_PATHS),
             "GPU reset: who runs `ixsmi -r`: helper (the privileged reset helper, at IX_RESET_HELPER_SOCKET), local "
             "(this process: it must be privileged), none (resets are unavailable), auto (helper where a socket is "
             "named, else local)", (RUN, DRA)),
    _setting("reset_helper_socket", "--reset-helper-socket", "IX_RESET_HELPER_SOCKET", None, v.path, "PATH",
             "the reset helper's unix socket (reset-helper: where it listens; run, dra: where the agent asks it to "
             "reset a chip)", (RUN, DRA, RESET_HELPER),
             mode_defaults=((RESET_HELPER, Path(DEFAULT_RESET_HELPER_SOCKET)),)),
    _setting("max_resets_per_minute", "--max-resets-per-minute", "IX_RESET_HELPER_MAX_PER_MINUTE", 12,
             v.whole_number(1, MAX_RESETS_PER_MINUTE), "N",
             "resets the helper runs in any minute; more are refused, saying when to retry", (RESET_HELPER,)),
    _setting("health_address", "--health-address", "IX_HEALTH_ADDRESS", ":8080", v.address, "HOST:PORT",
             "HTTP /healthz /readyz /metrics; `off` disables", DAEMONS),
    _setting("kubelet_registrar_directory_path", "--kubelet-registrar-directory-path",
             "KUBELET_REGISTRAR_DIRECTORY_PATH", Path(DEFAULT_REGISTRAR_DIR), v.path, "DIR",
             "the kubelet's plugin watcher directory, where the registration socket goes", DRA_MODES),
    _setting("kubelet_plugins_directory_path", "--kubelet-plugins-directory-path",
             "KUBELET_PLUGINS_DIRECTORY_PATH", Path(DEFAULT_KUBELET_PLUGINS_DIR), v.path, "DIR",
             "the kubelet's plugins directory: the node-health record (iluvatar.com/node-health.json) and the node's "
             "reset lock; dra: also the DRA socket and the checkpoint", (*DRA_MODES, RUN)),
    _setting("pod_uid", "--pod-uid", "POD_UID", None, v.pod_uid, "UID",
             "this pod's UID (downward API metadata.uid): sockets named per pod, so that an update overlaps the old "
             "pod (dra: kubelet 1.33+; run: 1.37+); unset: the fixed names", (RUN, DRA)),
    _setting("device_access", "--device-access", "IX_DEVICE_ACCESS", None, v.choice(*DEVICE_ACCESS_DEPLOYED),
             "|".join(DEVICE_ACCESS_DEPLOYED),
             "how this container is given the GPU device nodes (the chart's DaemonSet says): the NRI injector "
             "sidecar, the runtime, or privileged; the agent shows on its Node (label iluvatar.com/gpu.device-access) "
             "what works; unset: nothing is shown", DAEMONS),
    _setting("device_access_fallback", "--device-access-fallback", "IX_DEVICE_ACCESS_FALLBACK", "none",
             v.choice(*DEVICE_ACCESS_FALLBACKS), "|".join(DEVICE_ACCESS_FALLBACKS),
             "where the GPU device nodes cannot be opened: privileged moves the node to the chart's privileged "
             "DaemonSet; none (strict) leaves it without GPUs", DAEMONS),
    _setting("nri_status", "--nri-status", "IX_NRI_STATUS", None, v.path, "PATH",
             "the NRI injector sidecar's status file (registered, or unavailable: why)", DAEMONS),
    _setting("device_access_label", "--device-access-label", "IX_DEVICE_ACCESS_LABEL", True, v.parse_bool,
             "true|false", "label the Node with iluvatar.com/gpu.device-access (with --device-access; API access)",
             DAEMONS),
    _setting("zero_downtime_upgrade", "--zero-downtime-upgrade", "ZERO_DOWNTIME_UPGRADE", "auto",
             v.choice("auto", "true", "false"), "auto|true|false",
             "a pod started while another pod of the plugin serves the node registers beside it (true), or waits "
             "until that one stops (false); auto: beside it on a kubelet 1.37+ (the Node's kubeletVersion), else "
             "waits", (RUN,)),
    _setting("volcano_field_manager", "--volcano-field-manager", "IX_VOLCANO_FIELD_MANAGER",
             DEFAULT_VOLCANO_FIELD_MANAGER, v.field_manager, "NAME",
             "flags.usevolcano: the field manager Volcano's scheduler writes pod annotations as (the API server's "
             "metadata.managedFields); a pod whose iluvatar.com/DevVolcano or predicate-time another wrote is refused",
             (RUN,)),
    _setting("disabled_healthchecks", None, "IX_DISABLE_HEALTHCHECKS", frozenset(), parse_disabled_healthchecks,
             "LIST", "health checks not to act on: `all`, or a comma list of error names, `xids` and XID numbers",
             (RUN, LIST, DEMO, DRA, LIST_DRA)),
    _setting("log_level", "--log-level", "IX_LOG_LEVEL", "info", v.choice(*LOG_LEVELS), "|".join(LOG_LEVELS),
             "log level (debug also shows the libraries' own logs)", EVERY_MODE),
    _setting("log_format", "--log-format", "IX_LOG_FORMAT", "text", v.choice("text", "json"), "text|json",
             "log format", EVERY_MODE),
    # ---- the ix-config file's settings ----
    _setting("resource_name", "--resource-name", "IX_RESOURCE_NAME", DEFAULT_RESOURCE_NAME, v.resource_name, "NAME",
             "extended resource name advertised to the kubelet", PLUGIN_CONFIG, "resourceName"),
    _setting("splitboard", "--splitboard", "IX_SPLITBOARD", False, v.parse_bool, "true|false",
             "advertise every chip of a multi-chip board (BI-V150) as its own GPU (dra: what one iluvatar.com/gpu is, "
             "and which devices are shared)", (*PLUGIN_CONFIG, *DRA_MODES), "flags.splitboard", ("-splitboard",),
             "SPLIT_BOARD"),
    _setting("fail_on_init_error", "--fail-on-init-error", "IX_FAIL_ON_INIT_ERROR", True, v.parse_bool, "true|false",
             "exit when the GPU library cannot start; false advertises 0 GPUs and retries", (*PLUGIN_CONFIG, DRA),
             "flags.failOnInitError"),
    _setting("reset_gpu", "--reset-gpu", "IX_RESET_GPU", False, v.parse_bool, "true|false",
             "reset the chips (ixsmi -r) before a container gets them; needs NODE_NAME and API access",
             PLUGIN_CONFIG, "flags.reset_gpu", ("--reset_gpu", "-reset_gpu"), "RESET_GPU"),
    _setting("use_volcano", "--use-volcano", "IX_USE_VOLCANO", False, v.parse_bool, "true|false",
             "Volcano scheduling mode: give each pod the devices the scheduler chose; needs NODE_NAME and API access",
             PLUGIN_CONFIG, "flags.usevolcano", ("--usevolcano", "-usevolcano"), "USE_VOLCANO"),
    _setting("device_list_strategy", "--device-list-strategy", "IX_DEVICE_LIST_STRATEGY",
             DEFAULT_DEVICE_LIST_STRATEGY, strategy_setting, "LIST",
             "how Allocate names devices: device-specs, cdi-cri, cdi-annotations (a list, comma-joined as a flag)",
             PLUGIN_CONFIG, "flags.deviceListStrategy"),
    _setting("replicas", "--replicas", "IX_REPLICAS", 0, v.replicas, "INT",
             f"time-slicing replicas per GPU (0 or 1: no sharing; at most {v.MAX_REPLICAS}; dra: shares per device)",
             (*PLUGIN_CONFIG, *DRA_MODES), "sharing.timeSlicing.replicas"),
    _setting("rename_by_default", "--rename-by-default", "IX_RENAME_BY_DEFAULT", False, v.parse_bool, "true|false",
             "advertise shared GPUs as <resourceName>.shared", PLUGIN_CONFIG, "sharing.timeSlicing.renameByDefault"),
    _setting("fail_requests_greater_than_one", "--fail-requests-greater-than-one",
             "IX_FAIL_REQUESTS_GREATER_THAN_ONE", False, v.parse_bool, "true|false",
             "refuse a container asking for more than one shared replica", PLUGIN_CONFIG,
             "sharing.timeSlicing.failRequestsGreaterThanOne"),
    _setting("self_healing", "--self-healing", "IX_SELF_HEALING", "auto", parse_self_healing, "auto|true|false",
             "reset a chip with a resettable error once no container holds it, and return it to service (auto: where "
             "other IXML users can be asked to let go, through the API server)", HEALTH_MODES, "health.selfHealing"),
    _setting("reset_diagnostic", "--reset-diagnostic", "IX_RESET_DIAGNOSTIC", (), v.command, "COMMAND",
             "self-healing: a check run after a proven reset, before the chip returns (no shell; {uuid} is the "
             "chip's UUID); its exit status 0 returns the chip", HEALTH_MODES, "health.resetDiagnostic"),
    _setting("reset_diagnostic_timeout", "--reset-diagnostic-timeout", "IX_RESET_DIAGNOSTIC_TIMEOUT", 300.0,
             v.seconds, "SECONDS", "self-healing: how long the diagnostic may take (then it is killed: it failed)",
             HEALTH_MODES, "health.resetDiagnosticTimeout"),
    _setting("reset_limit", "--reset-limit", "IX_RESET_LIMIT", 2, v.reset_limit, "INT",
             "self-healing: a chip reset this many times (one per fault) within --reset-window is not reset again "
             "at its next fault but left to an operator (GPUResetLimitReached); 0: no limit", HEALTH_MODES,
             "health.resetLimit"),
    _setting("reset_window", "--reset-window", "IX_RESET_WINDOW", 86400.0, v.reset_window, "SECONDS",
             "self-healing: the window of --reset-limit, in seconds", HEALTH_MODES, "health.resetWindow"),
    _setting("health_reset", "--health-reset", "IX_HEALTH_RESET", (), parse_health_names, "LIST",
             "XIDs and health errors a GPU reset clears (besides the defaults)", HEALTH_MODES, "health.reset"),
    _setting("health_operator", "--health-operator", "IX_HEALTH_OPERATOR", (), parse_health_names, "LIST",
             "XIDs and health errors that keep a chip out until an operator acts (besides the defaults)",
             HEALTH_MODES, "health.operator"),
    _setting("health_ignore", "--health-ignore", "IX_HEALTH_IGNORE", (), parse_health_names, "LIST",
             "XIDs and health errors that leave a chip in service (besides the application XIDs)", HEALTH_MODES,
             "health.ignore"),
)  # fmt: skip
BY_NAME = {setting.name: setting for setting in SETTINGS}
BY_KEY = {setting.key: setting for setting in SETTINGS if setting.key is not None}
BY_FLAG = {setting.flag: setting for setting in SETTINGS if setting.flag is not None}
BY_FLAG.update({flag: setting for setting in SETTINGS for flag in setting.upstream_flags})
FILE_SETTINGS = tuple(setting for setting in SETTINGS if setting.key is not None)


def settings_of(mode: str) -> tuple[Setting, ...]:
    """The settings mode takes, in table order."""
    return tuple(setting for setting in SETTINGS if mode in setting.modes)


def default(name: str) -> Any:
    """The default value of the setting called name."""
    return BY_NAME[name].default
