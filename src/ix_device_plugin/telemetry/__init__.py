"""GPU telemetry, a node service of both front ends: every chip's figures under ix-exporter's metric names.

Labelled with the container that holds the chip (sampler: the passes; collector: the exposition).
"""
