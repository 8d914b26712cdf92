"""Devices from Iluvatar's IXML management library (libixml.so), called through ctypes.

library: finding, loading and binding the library; devices: what it says of each device; boards: which
chips share a board; events: the XID event waiter; sampling: telemetry; reset: `ixsmi -r`; backend: the
IxmlBackend the daemon uses.
"""

from ix_device_plugin.hardware.ixml.backend import IxmlBackend, NoDevicesError
from ix_device_plugin.hardware.ixml.devices import normalize_bus_id, placeholder_uuid, read_numa_node
from ix_device_plugin.hardware.ixml.library import find_library, load_library

__all__ = [
    "IxmlBackend",
    "NoDevicesError",
    "find_library",
    "load_library",
    "normalize_bus_id",
    "placeholder_uuid",
    "read_numa_node",
]
