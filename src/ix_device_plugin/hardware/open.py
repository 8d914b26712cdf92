"""The backend the options name, built on demand (the worker thread opens it; tests pass their own)."""

from __future__ import annotations

from collections.abc import Callable

from ix_device_plugin.hardware.backend import DEFAULT_IXSMI, Backend
from ix_device_plugin.settings.options import NodeOptions

BackendFactory = Callable[[], Backend]


def backend_factory(options: NodeOptions) -> BackendFactory:
    """A function creating the backend of options.backend: `simulated` or `ixml`."""
    if options.backend == "simulated":
        spec = options.simulated_devices
        ixsmi = None if options.ixsmi_path == DEFAULT_IXSMI else options.ixsmi_path  # a stand-in's, when named

        def simulated() -> Backend:
            from ix_device_plugin.hardware.simulated import SimulatedBackend

            return SimulatedBackend(spec, ixsmi, dev_root=options.dev_root)

        return simulated

    def ixml() -> Backend:
        from ix_device_plugin.hardware.ixml import IxmlBackend

        return IxmlBackend(
            options.ixml_library,
            dev_root=options.dev_root,
            sysfs_root=options.sysfs_root,
            ixsmi_path=options.ixsmi_path,
        )

    return ixml
