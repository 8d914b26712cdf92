"""What the DRA driver fixes of its node agent (nodeagent/kit.py), as plain values."""

from __future__ import annotations

import os

from ix_device_plugin.core.healing import Rules
from ix_device_plugin.dra.registration import plugin_dir
from ix_device_plugin.healing.story import story_path
from ix_device_plugin.nodeagent.frontend import Mode
from ix_device_plugin.runtime.noderole import NodeLocks
from ix_device_plugin.settings.options import DraOptions

# No settling time before a reset: a claim prepared on the chip meanwhile is refused under the state's lock.
DRA_HEALING = Rules(settle=0.0)


def dra_mode(options: DraOptions, boot_id: str, healing_rules: Rules | None) -> Mode:
    """What the DRA driver fixes of its node agent: one pod heals the node and listens for XIDs, the one publishing
    its slices; telemetry names the claims holding each chip."""
    return Mode(
        node_name=options.node_name,
        writer=f"dra {options.pod_uid or os.getpid()}",
        plugins_dir=options.plugins_dir,
        locks=NodeLocks.dra(options.plugins_dir),  # the device plugin's pods take the node's too
        duty=f"publishing the ResourceSlices of node {options.node_name}",
        story=story_path(plugin_dir(options.plugins_dir)),
        boot_id=boot_id,
        rules=healing_rules or DRA_HEALING,
        node_watched=True,  # for the slices' owner: the annotation iluvatar.com/gpu.return comes with it
        claims=True,
    )
