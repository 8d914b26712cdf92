"""What the device plugin hands its node agent (nodeagent/kit.py) besides itself.

What its mode fixes, as plain values, and the process's one connection to the API server.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ix_device_plugin.core.healing import Rules
from ix_device_plugin.healing.story import story_path
from ix_device_plugin.nodeagent.frontend import Mode
from ix_device_plugin.runtime.files import read_boot_id
from ix_device_plugin.runtime.noderole import NodeLocks
from ix_device_plugin.settings.options import Options

if TYPE_CHECKING:
    from ix_device_plugin.apiserver.connection import ApiConnection
    from ix_device_plugin.apiserver.settings import KubeSettings


def plugin_mode(options: Options, healing_rules: Rules | None) -> Mode:
    """What the device plugin fixes of its node agent: one pod acts for the node (resets, the CDI spec, labels,
    Events, GPU metrics) while another may serve the kubelet beside it during an update; without the plugins
    directory there is no node-health record and this process is alone."""
    plugins_dir = options.kubelet_plugins_directory_path
    return Mode(
        node_name=options.node_name,
        writer=f"device-plugin {options.pod_uid or os.getpid()}",
        plugins_dir=plugins_dir,
        locks=None if plugins_dir is None else NodeLocks.device_plugin(plugins_dir),
        duty=f"acting for node {options.node_name}'s GPUs",
        story=story_path(options.plugin_dir),
        boot_id=read_boot_id(),
        rules=healing_rules,
        held_through_stop=True,
        node_watched=options.per_node_config,  # the label's watch of the Node brings the operator's annotation
    )


def api_connection(kube: KubeSettings | None) -> ApiConnection | None:
    """The connection to the API server, when a feature needs one (nothing is imported or asked before its use)."""
    if kube is None:
        return None
    from ix_device_plugin.apiserver.connection import ApiConnection

    return ApiConnection(kube)
