"""`ix-device-plugin template`: print the ResourceSlices a node of a given shape and ix-config would publish.

The shell of `dra/template.py`: it reads the ix-config file as the DRA driver reads it (flags.splitboard and
sharing.timeSlicing.replicas count; the other keys change nothing in the slices) and prints the slices as YAML
documents, or as JSON (a `v1` List).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import yaml

from ix_device_plugin.dra.slices import SlicePolicy
from ix_device_plugin.dra.template import DEFAULT_NODE, TemplateError, template_slices
from ix_device_plugin.hardware.simulated import DEFAULT_DRIVER_VERSION
from ix_device_plugin.settings.config import Config
from ix_device_plugin.settings.configfile import load_file
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.resolve import config_from
from ix_device_plugin.settings.table import DRA

USAGE_ERROR = 2
YAML, JSON = "yaml", "json"


def template_config(path: str | None) -> tuple[Config, tuple[str, ...]]:
    """The configuration the DRA driver would run with from the ix-config file at path (None: the defaults), and
    what it would warn about; SettingsError naming every problem."""
    if path is None:
        return config_from(None, {}, mode=DRA), ()
    file = load_file(path, DRA)
    return config_from(file, {}, mode=DRA), file.warnings


def rendered(objects: list[dict[str, Any]], output: str) -> str:
    """objects as YAML documents, or as the JSON of a v1 List."""
    if output == JSON:
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    return yaml.safe_dump_all(objects, sort_keys=False, explicit_start=True)


def template_command(arguments: Mapping[str, str | None], output: str | None) -> int:
    """Print the node template that arguments (product, boards, config, node, driver_version) describe; exit code 2,
    naming what was wrong, for an input no node can have."""
    try:
        config, warnings = template_config(arguments.get("config_file"))
        objects = template_slices(
            str(arguments.get("product") or ""),
            str(arguments.get("boards") or ""),
            SlicePolicy(config.splitboard, config.replicas),
            arguments.get("node") or DEFAULT_NODE,
            arguments.get("driver_version") or DEFAULT_DRIVER_VERSION,
        )
    except (SettingsError, TemplateError) as error:
        messages = error.messages if isinstance(error, SettingsError) else [str(error)]
        for message in messages:
            print(f"ix-device-plugin template: error: {message}", file=sys.stderr)
        return USAGE_ERROR
    for warning in warnings:
        print(f"ix-device-plugin template: warning: {warning}", file=sys.stderr)
    sys.stdout.write(rendered(objects, output or YAML))
    return 0
