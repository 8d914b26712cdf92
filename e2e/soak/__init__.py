"""The chaos soak: a seeded fault schedule and workload run on the end-to-end cluster, checked from outside."""
