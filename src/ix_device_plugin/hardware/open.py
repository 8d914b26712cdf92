"""The backend the options name, built on demand (the worker thread opens it; tests pass their own)."""

from __future__ import annotations

from collections.abc import Callable

from ix_device_plugin.hardware.backend import DEFAULT_IXSMI, Backend
from ix_device_plugin.hardware.resetpath import Resetter, resetter_for
from ix_device_plugin.settings.options import NodeOptions

BackendFactory = Callable[[], Backend]


def backend_factory(options: NodeOptions) -> BackendFactory:
    """A function creating the backend of options.backend: `simulated` or `ixml`."""
    if options.backend == "simulated":
        spec = options.simulated_devices
        ixsmi = None if options.ixsmi_path == DEFAULT_IXSMI else options.ixsmi_path  # a stand-in's, when named

        def simulated() -> Backend:
            from ix_device_plugin.hardware.simulated import SimulatedBackend

            return SimulatedBackend(spec, ixsmi, dev_root=options.dev_root, resetter=resetter(options, ixsmi))

        return simulated

    def ixml() -> Backend:
        from ix_device_plugin.hardware.ixml import IxmlBackend

        return IxmlBackend(
            options.ixml_library,
            dev_root=options.dev_root,
            sysfs_root=options.sysfs_root,
            ixsmi_path=options.ixsmi_path,
            resetter=resetter(options, options.ixsmi_path),
        )

    return ixml


def resetter(options: NodeOptions, ixsmi_path: str | None) -> Resetter:
    """Who runs ixsmi -r for the backend (hardware/resetpath.py), from --reset-via and --reset-helper-socket."""
    from ix_device_plugin.hardware.resetaccess import reset_drivers_dir

    socket = "" if options.reset_helper_socket is None else str(options.reset_helper_socket)
    return resetter_for(options.reset_via, socket, ixsmi_path, reset_drivers_dir(options))
