"""Errors that end the daemon's start, with a message that says why and what to do."""

from __future__ import annotations


class StartupError(Exception):
    """The daemon cannot start (or serve again); the message says why and what to do."""
