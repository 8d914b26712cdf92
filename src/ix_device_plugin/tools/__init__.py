"""Commands beside the daemon: list, demo."""
