"""Settings: the config file, flags and environment variables; imports nothing else of the package."""
