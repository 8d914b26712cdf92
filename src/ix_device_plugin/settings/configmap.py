"""ConfigMap manifests that carry ix-config files, each data key checked as a configuration.

`check-config` reads them as an operator is about to apply them: the ConfigMap's `ix-config` key, and the named
ones a node label can pick, with messages naming the key and the line in the manifest.
"""

from __future__ import annotations

import yaml

from ix_device_plugin.settings.configfile import CONFIG_KEY, FileConfig, is_null, parse_bytes, parse_text
from ix_device_plugin.settings.errors import SettingsError
from ix_device_plugin.settings.yamlsafe import YamlError, compose_all, decode


def load_document(data: bytes, origin: str, strict: bool = False) -> dict[str, FileConfig]:
    """The configurations in a ConfigMap manifest (by data key), or in a bare config file (under ix-config).

    Every data key of a ConfigMap is checked as a configuration (ix-config, and the named ones a node
    label can pick); a manifest without data.ix-config is an error. Raises SettingsError with every problem.
    """
    try:
        documents = compose_all(decode(data))
    except YamlError as error:
        raise SettingsError([f"{origin}: {error}"]) from None
    maps = [document for document in documents if _is_config_map(document)]
    if not maps:
        return {CONFIG_KEY: parse_bytes(data, origin, strict=strict)}
    results: dict[str, FileConfig] = {}
    errors: list[str] = []
    for manifest in maps:
        try:
            results.update(_config_map_data(manifest, origin, strict))
        except SettingsError as error:
            errors.extend(error.messages)
    if not errors and CONFIG_KEY not in results:
        errors.append(f"{origin}: the ConfigMap has no data.{CONFIG_KEY} key, which the plugin reads")
    if errors:
        raise SettingsError(errors)
    return results


def _is_config_map(node: yaml.Node) -> bool:
    if not isinstance(node, yaml.MappingNode):
        return False
    return any(
        isinstance(key, yaml.ScalarNode) and key.value == "kind" and getattr(value, "value", None) == "ConfigMap"
        for key, value in node.value
    )


def _config_map_data(manifest: yaml.MappingNode, origin: str, strict: bool) -> dict[str, FileConfig]:
    data = next((value for key, value in manifest.value if getattr(key, "value", None) == "data"), None)
    if data is None or is_null(data):
        raise SettingsError([f"{origin}: the ConfigMap has no data"])
    if not isinstance(data, yaml.MappingNode):
        raise SettingsError([f"{origin}: line {data.start_mark.line + 1}: data: expected a mapping of keys to text"])
    results, errors = {}, []
    for key, value in data.value:
        where = f"{origin}: data.{getattr(key, 'value', '?')}"
        if not isinstance(key, yaml.ScalarNode) or not isinstance(value, yaml.ScalarNode):
            errors.append(f"{where}: line {key.start_mark.line + 1}: expected a key with text")
            continue
        # A block scalar's text starts on the line after its `|`; a quoted or plain one on its own line.
        offset = value.start_mark.line + (1 if value.style in {"|", ">"} else 0)
        try:
            results[key.value] = parse_text(value.value, where, offset, strict=strict)
        except SettingsError as error:
            errors.extend(error.messages)
    if errors:
        raise SettingsError(errors)
    return results
