"""The service skeleton both modes run on: signals, bounded stop, probes, logs, backoff, file watch, writes."""
