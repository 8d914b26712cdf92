"""The console script `ix-device-plugin`, which takes SIGTERM before anything slow is imported.

runtime/earlystop.py says why. It then runs the command line (cli.py), which lets go of SIGTERM again for the
commands that are no daemon.
"""

from __future__ import annotations

from ix_device_plugin.runtime import earlystop


def main() -> int:
    earlystop.catch()
    from ix_device_plugin.cli import main as command_line

    return command_line()
