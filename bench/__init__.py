"""Benchmarks of the plugin's speed, footprint and scale on simulated devices: `python -m bench`."""
