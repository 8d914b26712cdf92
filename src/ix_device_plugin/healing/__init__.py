"""Self-healing GPUs, a node service of both front ends: a chip a reset can fix is reset once no container holds it and
returned to service; every health change and step is a Node Event, a metric and a line of `list`."""
