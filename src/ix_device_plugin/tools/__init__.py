"""Commands beside the daemons: list, cdi generate, check-config, demo and template."""
